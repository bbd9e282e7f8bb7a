"""The engine core's unnamed locks (`rollout/processes/core_semaphores.py`), in real spawned processes named as vLLM names them."""

import multiprocessing
import os
from pathlib import Path

import pytest

from lit_asyncrl.rollout.processes import core_semaphores
from lit_asyncrl.rollout.processes.core_semaphores import UNNAMED_LOCKS_VARIABLE


def _child(report: str) -> None:
    core_semaphores.register()
    lock = multiprocessing.Lock()  # what vLLM's executor makes as it starts
    with lock:
        works = not lock.acquire(block=False)  # taken, so a second take fails
    name = lock._semlock.name  # None once Python unlinked it; else its file is /dev/shm/sem.<name>
    in_dev_shm = name is not None and Path(f"/dev/shm/sem.{name.lstrip('/')}").exists()
    Path(report).write_text(f"{works} {name is not None} {in_dev_shm}")


def _run(tmp_path: Path, name: str, armed: bool) -> str:
    """'<lock works> <lock has a name> <its file is in /dev/shm>' as the child saw them."""
    report = tmp_path / f"{name}-{armed}"
    previous = os.environ.get(UNNAMED_LOCKS_VARIABLE)
    os.environ[UNNAMED_LOCKS_VARIABLE] = "1" if armed else "0"
    try:
        process = multiprocessing.get_context("spawn").Process(target=_child, args=(str(report),), name=name)
        process.start()
        process.join(60)
    finally:
        os.environ.pop(UNNAMED_LOCKS_VARIABLE) if previous is None else os.environ.__setitem__(
            UNNAMED_LOCKS_VARIABLE, previous
        )
    assert process.exitcode == 0
    return report.read_text()


@pytest.mark.parametrize(
    ("name", "armed", "seen"),
    [
        ("EngineCore_DP0", True, "True False False"),
        ("EngineCore_DP0", False, "True True True"),
        ("Worker", True, "True True True"),
    ],
)
def test_only_an_armed_engine_core_makes_locks_without_a_file_in_dev_shm(tmp_path, name, armed, seen):
    assert _run(tmp_path, name, armed) == seen
