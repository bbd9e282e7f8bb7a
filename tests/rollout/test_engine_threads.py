"""The engine sets OMP_NUM_THREADS=1 only for the processes it spawns, and restores the caller's."""

import os

import pytest

from lit_asyncrl.rollout.engine import _one_omp_thread_in_spawned_processes


@pytest.mark.parametrize("before", [None, "2"])
def test_one_thread_inside_the_block_and_the_callers_value_after(monkeypatch, before):
    if before is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", before)
    with _one_omp_thread_in_spawned_processes(True):
        assert os.environ["OMP_NUM_THREADS"] == "1"
    assert os.environ.get("OMP_NUM_THREADS") == before


def test_an_error_inside_the_block_restores_too_and_inactive_changes_nothing(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    with pytest.raises(RuntimeError), _one_omp_thread_in_spawned_processes(True):
        raise RuntimeError("engine creation failed")
    assert os.environ["OMP_NUM_THREADS"] == "4"
    with _one_omp_thread_in_spawned_processes(False):
        assert os.environ["OMP_NUM_THREADS"] == "4"
