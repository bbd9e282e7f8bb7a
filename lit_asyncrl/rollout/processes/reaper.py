"""Cleans up after a trainer that was killed outright (SIGKILL, OOM killer): no orphan engine.

vLLM's engine-core process outlives a SIGKILLed parent (it is re-parented to init and keeps its
memory and cores), and nothing in the dead process can remove its /dev/shm weights directory. The
reaper is a tiny separate process, in its own session so a terminal's Ctrl-C does not reach it: while
the trainer lives it records the trainer's descendants every `POLL_S`; once the trainer is gone it
kills the recorded processes that still run (same pid and start time, so a reused pid is never hit),
removes the given paths, and exits. A trainer that shuts down cleanly stops its reaper first.

Run as `python -m lit_asyncrl.rollout.processes.reaper TRAINER_PID PATH...`; it imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from lit_asyncrl.rollout.processes.temp_dirs import remove_dirs_of

POLL_S = 0.5


def start_reaper(paths: list[str | Path]) -> subprocess.Popen:
    """Start a reaper watching this process; `paths` are removed if this process dies."""
    return subprocess.Popen(
        [sys.executable, "-m", "lit_asyncrl.rollout.processes.reaper", str(os.getpid()), *map(str, paths)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop_reaper(reaper: subprocess.Popen | None) -> None:
    """The trainer is shutting down cleanly: the reaper has nothing left to do."""
    if reaper is not None and reaper.poll() is None:
        reaper.terminate()
        try:
            reaper.wait(timeout=5)
        except subprocess.TimeoutExpired:
            reaper.kill()
            reaper.wait()


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) of a process, None when it does not exist."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[19])


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def _descendants(root: int) -> dict[int, int]:
    """{pid: start time} of every process below `root`."""
    parents: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            parents.setdefault(stat[1], []).append((int(entry), stat[2]))
    found = {}
    frontier = [root]
    while frontier:
        for child, started in parents.get(frontier.pop(), []):
            if child not in found:
                found[child] = started
                frontier.append(child)
    return found


#: Processes a reaper never kills: multiprocessing's resource tracker (once every process holding its
#: pipe is gone, it unlinks the named semaphores, /dev/shm/sem.mp-*, they leaked; killed with the
#: others, it would leave them) and the trainer's other reapers (a process has one for its run dir and
#: one per engine; a reaper that killed another before that one removed its paths would leave them:
#: seen as an engine's weights dir left after a SIGKILL).
SPARED_COMMANDS = (b"multiprocessing.resource_tracker", b"lit_asyncrl.rollout.processes.reaper")


def _is_spared(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(name in command for name in SPARED_COMMANDS)


def watch(trainer_pid: int, paths: list[str]) -> None:
    recorded: dict[int, int] = {}
    spared: set[int] = {os.getpid()}
    while _alive(trainer_pid):
        for pid, started in _descendants(trainer_pid).items():
            if pid not in recorded and pid not in spared:
                if _is_spared(pid):
                    spared.add(pid)
                else:
                    recorded[pid] = started
        time.sleep(POLL_S)
    for pid, started in recorded.items():
        stat = _stat(pid)
        if stat is not None and stat[2] == started:
            with contextlib.suppress(OSError):  # it ended by itself meanwhile
                os.kill(pid, signal.SIGKILL)
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)
    # The dirs the killed processes made for themselves (a Ray actor's engine makes its own
    # weights and run dirs, named after its pid; `temp_dirs.py`).
    remove_dirs_of(set(recorded))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the trainer's death or its own stop ends it
    watch(int(sys.argv[1]), sys.argv[2:])
