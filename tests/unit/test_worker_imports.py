"""The processes that only score or generate import no Lightning: a spawned old-logit worker and
Ray's engine and old-logit actors load the modules below, and Lightning's import (with torchmetrics
and what it pulls) was 4.6 s of a spawned worker's 7.5 s of imports before the callbacks package
imported its callbacks on first use."""

import subprocess
import sys

import pytest

WORKER_MODULES = (
    "asyncrl_callbacks.eval_mode",
    "asyncrl_callbacks.snapshot_store",
    "lit_asyncrl.rollout.old_logits.dedicated",
    "lit_asyncrl.rollout.ray_actors.engine",
    "lit_asyncrl.rollout.ray_actors.dedicated_worker",
)

IMPORT_AND_LIST = f"""
import sys
for name in {WORKER_MODULES!r}:
    __import__(name)
print(sorted({{name.split(".")[0] for name in sys.modules}} & {{"lightning", "torchmetrics", "pytorch_lightning"}}))
print("torch" in sys.modules)
"""


def test_the_worker_modules_import_no_lightning():
    result = subprocess.run([sys.executable, "-c", IMPORT_AND_LIST], capture_output=True, text=True, check=True)
    assert result.stdout.split("\n")[:2] == ["[]", "True"]  # torch was imported: the modules really loaded


def test_the_callbacks_are_still_the_packages_names():
    import asyncrl_callbacks
    from asyncrl_callbacks.ewma import EWMAReference
    from asyncrl_callbacks.interrupt_sync import InterruptibleRollouts, InterruptSync
    from asyncrl_callbacks.snapshot import SnapshotRetention

    assert asyncrl_callbacks.EWMAReference is EWMAReference
    assert asyncrl_callbacks.InterruptSync is InterruptSync is asyncrl_callbacks.InterruptionSync
    assert asyncrl_callbacks.InterruptibleRollouts is InterruptibleRollouts
    assert asyncrl_callbacks.SnapshotRetention is SnapshotRetention
    assert set(asyncrl_callbacks.__all__) <= set(dir(asyncrl_callbacks))
    with pytest.raises(AttributeError, match="NoSuchCallback"):
        asyncrl_callbacks.NoSuchCallback  # noqa: B018
