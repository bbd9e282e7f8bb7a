"""Idle OpenMP threads sleep in every process of a run unless the user chose otherwise."""

import os
import subprocess
import sys

from lit_asyncrl.cpu_threads import let_idle_threads_sleep

#: What the Hydra entry point imports first leaves the policy set and torch (so OpenMP) not yet loaded.
ENTRY_POINT_IMPORTS = """
import os, sys
import lit_asyncrl.train
print("torch" in sys.modules, os.environ.get("OMP_WAIT_POLICY"))
"""


def test_the_entry_point_sets_passive_before_torch_loads_openmp():
    environment = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
    result = subprocess.run(
        [sys.executable, "-c", ENTRY_POINT_IMPORTS], env=environment, capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "PASSIVE"]


def test_a_policy_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    let_idle_threads_sleep()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
