"""A vLLM plugin: the engine core process exits as soon as its own shutdown is done.

vLLM's engine core tears down its scheduler, executor and distributed state itself when it is told
to stop. After that the Python interpreter still finalizes the process: a garbage collection over
the whole heap (vLLM unfreezes its start-up objects for it) and the teardown of every module torch
and vLLM loaded. Measured on a 2-core CPU machine: 1.3 s with no system call between the engine's
last clean-up and `exit_group`, so an engine's shutdown took 2.3 s instead of 0.9 s, and the
trainer waits for it at the end of every run (and at every engine restart).

Enabled only where `rollout/engine/settings.py` asks for it (an environment variable set while it spawns an
eager CPU engine) and only in the engine-core process. The exit status is the one the process was
going to exit with; exit handlers registered after this plugin loaded (vLLM's, torch's) still run,
since `atexit` runs handlers last-registered first, and this one is registered when vLLM loads its
plugins at the start of the process.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import sys

#: Set (to "1") in the environment of the engine-core process that should exit this way.
FAST_EXIT_VARIABLE = "LIT_ASYNCRL_ENGINE_CORE_FAST_EXIT"
#: vLLM names its engine-core processes EngineCore, EngineCore_DP0, ...
ENGINE_CORE_PROCESS_PREFIX = "EngineCore"

_armed = False
_exit_status: list[object] = []  # what the process's last `sys.exit` was called with


def register() -> None:
    """vLLM plugin hook (run in every vLLM process): arm the fast exit in an engine core that asked."""
    global _armed
    if _armed or os.environ.get(FAST_EXIT_VARIABLE) != "1" or not in_engine_core():
        return
    _armed = True
    plain_exit = sys.exit

    def exit_recording_status(status: object = None) -> None:
        # multiprocessing's spawned child ends with sys.exit(exit code): remember the code.
        _exit_status[:] = [status]
        plain_exit(status)

    sys.exit = exit_recording_status
    atexit.register(_exit_now)


def exit_code(status: object) -> int:
    """The process exit code Python gives `sys.exit(status)` (a message is printed and exits 1)."""
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    return 1


def in_engine_core() -> bool:
    """Whether this is one of vLLM's engine-core processes (spawned, and named by vLLM)."""
    return multiprocessing.parent_process() is not None and multiprocessing.current_process().name.startswith(
        ENGINE_CORE_PROCESS_PREFIX
    )


def _exit_now() -> None:
    if not _exit_status:
        return  # the process is not ending through sys.exit: let the interpreter finish as usual
    logging.shutdown()  # registered with atexit before this handler, so it would not run otherwise
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(exit_code(_exit_status[0]))
