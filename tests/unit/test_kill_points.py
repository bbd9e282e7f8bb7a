"""The crash tests' kill points: what the variable says, and a process that reaches its point dies by SIGKILL."""

import os
import signal
import subprocess
import sys

import pytest

from lit_asyncrl.kill_points import KILL_AT, kill_points


def test_the_points_are_read_and_a_typo_is_named():
    assert kill_points("weight_push@5, checkpoint_write@8,") == {("weight_push", 5), ("checkpoint_write", 8)}
    with pytest.raises(ValueError, match=r"^LIT_ASYNCRL_KILL_AT='weight_psh@5': 'weight_psh@5' is not <point>@<step>"):
        kill_points("weight_psh@5")
    with pytest.raises(ValueError, match="'checkpoint_write@x' is not"):
        kill_points("checkpoint_write@x")


@pytest.mark.parametrize(("step", "returncode"), [(3, -signal.SIGKILL), (4, 0)])
def test_a_process_dies_at_its_point_and_step_only(step, returncode):
    code = f"from lit_asyncrl.kill_points import kill_if_asked; kill_if_asked('weight_push', {step}); kill_if_asked('checkpoint_write', 3)"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, KILL_AT: "weight_push@3"}, timeout=60)
    assert done.returncode == returncode
