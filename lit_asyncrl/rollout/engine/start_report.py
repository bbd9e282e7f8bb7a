"""What an engine start that hangs was doing when it was given up, and ending the processes it made.

A start that never finishes leaves nothing to read in a log: vLLM's engine creation blocks in the
starting thread, and its engine core may block before it prints anything (seen once in a whole test
run: no engine-core process ever took its name within 300 s). The report names where the starting
thread stood (its innermost frames) and, for each process the start made, its title and what the
kernel says it waits in, so a hang seen once can be placed.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import traceback
from collections.abc import Iterable
from multiprocessing.process import BaseProcess
from pathlib import Path

#: How many of the starting thread's innermost frames the report names.
FRAMES_SHOWN = 4


def where_the_start_stands(thread: threading.Thread | None, processes: Iterable[BaseProcess]) -> str:
    """The starting thread's innermost frames and the state of each process the start made."""
    parts = [_thread_frames(thread)]
    parts.extend(_process_state(process) for process in processes)
    return "; ".join(parts)


def processes_made_since(before: set[BaseProcess]) -> list[BaseProcess]:
    """The live child processes of this process that are not in `before` (taken as the start began)."""
    return [process for process in multiprocessing.active_children() if process not in before]


def end_processes(processes: Iterable[BaseProcess]) -> None:
    """Kill each process (a start blocked on its engine core then fails at once instead of hanging)."""
    for process in processes:
        if process.is_alive():
            process.kill()


def _thread_frames(thread: threading.Thread | None) -> str:
    frame = sys._current_frames().get(thread.ident) if thread is not None and thread.ident is not None else None
    if frame is None:
        return "the starting thread is gone"
    innermost = traceback.extract_stack(frame)[-FRAMES_SHOWN:]
    where = " <- ".join(f"{Path(entry.filename).name}:{entry.lineno} {entry.name}" for entry in reversed(innermost))
    return f"the starting thread was at {where}"


def _process_state(process: BaseProcess) -> str:
    proc = Path(f"/proc/{process.pid}")
    try:
        title = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        waiting_in = (proc / "wchan").read_text() or "nothing"
    except (OSError, IndexError):
        return f"its process {process.pid} ({process.name}) is gone"
    return f"its process {process.pid} ({process.name}, titled {title!r}) was in state {state}, waiting in {waiting_in}"
