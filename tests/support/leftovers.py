"""What a run left in /tmp and /dev/shm: listings before and after, less what live processes still hold.

Another test worker's run may be going on at the same time; its files are held by its processes
(open, mapped, listening, or named after a live owner pid), so an entry counts as left behind only
when nothing alive holds it.
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from pathlib import Path

ROOTS = (Path(tempfile.gettempdir()), Path("/dev/shm"))
#: Our own dirs carry their owner's pid: `lit_asyncrl_run_<pid>_*`, `lit_asyncrl_weights_<pid>_*`.
OWNED = re.compile(r"lit_asyncrl_[a-z]+_(\d+)_")


def listing() -> set[Path]:
    """Every top-level entry of /tmp and /dev/shm now."""
    return {entry for root in ROOTS if root.is_dir() for entry in root.iterdir()}


def left_behind(before: set[Path], own_processes: set[int] | None = None) -> list[str]:
    """Entries that are new since `before` and that no live process holds (pytest's basetemp aside).

    With `own_processes` (every process one run started, all gone by now), a named semaphore
    (`sem.mp-*`) does not count while a resource tracker outside them lives: a semaphore's name does
    not say whose it is, and one that another test's killed process leaked stays until that
    process's tracker, still alive, unlinks it. The session's own check, with no such tracker left,
    counts every semaphore.
    """
    new = listing() - before
    if not new:
        return []
    held = _held_paths()
    basetemp = f"pytest-of-{getpass.getuser()}"
    foreign_tracker = own_processes is not None and any(pid not in own_processes for pid in resource_trackers())
    return sorted(
        str(entry)
        for entry in new
        if entry.name != basetemp
        and not _is_held(entry, held)
        and not (foreign_tracker and entry.name.startswith("sem.mp-"))
    )


def resource_trackers() -> list[int]:
    """Live multiprocessing resource trackers (they unlink the semaphores their processes leaked)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"multiprocessing.resource_tracker" in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _is_held(entry: Path, held: set[str]) -> bool:
    owner = OWNED.match(entry.name)
    if owner and Path(f"/proc/{owner.group(1)}").exists():
        return True
    text = str(entry)
    return any(path == text or path.startswith(text + "/") for path in held)


def _held_paths() -> set[str]:
    """Paths that live processes have open or mapped, and the paths of bound unix sockets."""
    held: set[str] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            for fd in (proc / "fd").iterdir():
                try:
                    held.add(os.readlink(fd))
                except OSError:
                    continue
            for line in (proc / "maps").read_text().splitlines():
                parts = line.split(maxsplit=5)
                if len(parts) == 6:
                    held.add(parts[5].removesuffix(" (deleted)"))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    try:
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) == 8:
                held.add(parts[7])
    except OSError:
        pass
    return held
