"""Bad configuration fails before any engine starts, with a message naming the key to fix."""

import re
import subprocess
import sys
import time

import pytest

from lit_asyncrl.datamodule import RolloutDataModule
from lit_asyncrl.losses import DecoupledPPO
from lit_asyncrl.module import AsyncRLModule


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"model_path": "/nonexistent/model"}, "model.path"),
        ({"max_version_gap": -1}, "data.max_version_gap"),
        ({"group_size": 8, "groups_per_batch": 16, "buffer_capacity": 64}, "data.buffer_capacity"),
        ({"mode": "sync", "weight_sync_every": 2}, "data.weight_sync_every"),
        ({"temperature": 0.0}, "data.temperature"),
        ({"group_size": 0}, "data.group_size"),
    ],
)
def test_datamodule_rejects_bad_config_before_the_engine(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        RolloutDataModule(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"model_path": "/nonexistent/model"}, "model.path"),
        ({"loss": "decoupled_ppo"}, "model.loss must be a lit_asyncrl.losses.LossStrategy"),  # a name is not an object
        ({"reference": "snapshot"}, "model.reference must be a lit_asyncrl.reference.ReferenceSource"),
        ({"loss": DecoupledPPO()}, "model.reference"),  # needs pi_ref, none configured
    ],
)
def test_module_rejects_bad_config(kwargs, fragment):
    with pytest.raises((ValueError, TypeError), match=re.escape(fragment)):
        AsyncRLModule(**kwargs)


def test_inverted_bounds_name_the_argument():
    with pytest.raises(ValueError, match="clip_bounds"):
        DecoupledPPO(clip_bounds=(1.2, 0.8))


def test_bad_engine_log_level_names_the_key():
    with pytest.raises(ValueError, match=r"data\.engine_log_level"):
        RolloutDataModule(engine_log_level="LOUD")


def test_hydra_entry_fails_fast_on_a_missing_model_path(tmp_path):
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "lit_asyncrl.train", "model.path=/nonexistent/model", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "model.path='/nonexistent/model'" in result.stderr + result.stdout
    assert "EngineCore" not in result.stderr + result.stdout  # no engine was started
    assert time.monotonic() - start < 120
