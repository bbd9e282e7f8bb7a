"""The engine sets environment values (OMP_NUM_THREADS=1, TMPDIR) only for the processes it spawns,
and restores the caller's."""

import os

import pytest

from lit_asyncrl.rollout.processes.spawn_environment import spawned_process_environment


@pytest.mark.parametrize("before", [None, "2"])
def test_the_values_inside_the_block_and_the_callers_after(monkeypatch, before):
    if before is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", before)
    monkeypatch.setenv("TMPDIR", "/tmp")
    with spawned_process_environment({"OMP_NUM_THREADS": "1", "TMPDIR": "/dev/shm/engine"}):
        assert os.environ["OMP_NUM_THREADS"] == "1"
        assert os.environ["TMPDIR"] == "/dev/shm/engine"
    assert os.environ.get("OMP_NUM_THREADS") == before
    assert os.environ["TMPDIR"] == "/tmp"


def test_an_error_inside_the_block_restores_too_and_no_values_change_nothing(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    with pytest.raises(RuntimeError), spawned_process_environment({"OMP_NUM_THREADS": "1"}):
        raise RuntimeError("engine creation failed")
    assert os.environ["OMP_NUM_THREADS"] == "4"
    with spawned_process_environment({}):
        assert os.environ["OMP_NUM_THREADS"] == "4"
