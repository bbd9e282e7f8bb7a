"""The engine core's fast exit (`rollout/processes/core_exit.py`), in real spawned processes named as vLLM names them."""

import atexit
import multiprocessing
import os
import sys
from pathlib import Path

import pytest

from lit_asyncrl.rollout.processes import core_exit
from lit_asyncrl.rollout.processes.core_exit import FAST_EXIT_VARIABLE, exit_code


def _child(marker: str, status: object) -> None:
    # Registered before the plugin (as logging's is): the fast exit skips it, the usual exit runs it.
    atexit.register(lambda: Path(marker + ".early").write_text("ran"))
    core_exit.register()
    # Registered after the plugin, as vLLM's and torch's own handlers are: it must still run.
    atexit.register(lambda: Path(marker).write_text("ran"))
    print("flushed before the exit", end="")  # left in the buffer: the fast exit must flush it
    sys.exit(status)


def _run(tmp_path: Path, name: str, status: object, armed: bool) -> tuple[int, str, bool]:
    """(exit code, what the child printed, whether the interpreter's own exit ran)."""
    marker, output = tmp_path / "marker", tmp_path / "out"
    context = multiprocessing.get_context("spawn")
    previous = os.environ.get(FAST_EXIT_VARIABLE)
    os.environ[FAST_EXIT_VARIABLE] = "1" if armed else "0"
    try:
        with open(output, "w") as handle:
            saved = os.dup(1)
            os.dup2(handle.fileno(), 1)  # the child's stdout, inherited at spawn
            try:
                process = context.Process(target=_child, args=(str(marker), status), name=name)
                process.start()
            finally:
                os.dup2(saved, 1)
                os.close(saved)
        process.join(60)
    finally:
        os.environ.pop(FAST_EXIT_VARIABLE) if previous is None else os.environ.__setitem__(FAST_EXIT_VARIABLE, previous)
    assert marker.read_text() == "ran"
    return process.exitcode, output.read_text(), Path(f"{marker}.early").exists()


@pytest.mark.parametrize(("status", "code"), [(None, 0), (0, 0), (3, 3)])
def test_an_engine_core_exits_with_its_own_status_after_later_exit_handlers(tmp_path, status, code):
    assert _run(tmp_path, "EngineCore_DP0", status, armed=True) == (code, "flushed before the exit", False)


def test_other_processes_and_unarmed_engine_cores_exit_as_usual(tmp_path):
    assert _run(tmp_path, "EngineCore_DP0", 3, armed=False) == (3, "flushed before the exit", True)
    (tmp_path / "worker").mkdir()
    assert _run(tmp_path / "worker", "Worker", 3, armed=True) == (3, "flushed before the exit", True)


def test_exit_code_is_what_python_gives_sys_exit():
    assert [exit_code(None), exit_code(0), exit_code(2), exit_code(256 + 5), exit_code("a message")] == [0, 0, 2, 5, 1]
