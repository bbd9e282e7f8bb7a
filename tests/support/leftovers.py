"""What a run left behind: listings before and after, less what live processes still hold.

The test session gives every process it starts a temp dir of its own (`TMPDIR`, made by
`start_session_temp_dir`): whatever is new there counts, whichever library made it. The machine's
shared /tmp and /dev/shm are other programs' too (an editor, a build, another checkout's tests), so
there only the names a run of ours can make count: our own dirs, multiprocessing's semaphores,
shared memory and temp dirs, Ray's and vLLM's files, and vLLM's IPC sockets (bare uuids).

Another test worker's run may be going on at the same time; its files are held by its processes
(open, mapped, listening, or named after a live owner pid), so an entry counts as left behind only
when nothing alive holds it.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import tempfile
from pathlib import Path

SHARED_ROOTS = (Path("/tmp"), Path("/dev/shm"))
#: Set by the test session for every process it starts: the temp dir of its own.
SESSION_TEMP_DIR_VARIABLE = "LIT_ASYNCRL_TEST_TMPDIR"
SESSION_TEMP_DIR_PREFIX = "lit_asyncrl_tests_"
#: Our own dirs carry their owner's pid: `lit_asyncrl_run_<pid>_*`, `lit_asyncrl_weights_<pid>_*`.
OWNED = re.compile(r"lit_asyncrl_[a-z]+_(\d+)_")
#: What a run of ours can leave in the shared roots: our dirs (`lit_asyncrl_*`), multiprocessing's
#: semaphores, shared memory blocks and temp dirs, torch's shared tensors, Ray's and vLLM's files and
#: torch's compile cache where their defaults put them, vLLM's ZMQ sockets (named by a bare uuid).
OURS_IN_SHARED_ROOTS = re.compile(
    r"lit_asyncrl_|sem\.mp-|psm_|wnsm_|pymp-|torch_|torchinductor_|ray|vllm"
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
)


def start_session_temp_dir() -> Path:
    """Make the test session's own temp dir and point every process started from now on at it.

    pytest's `tmp_path` dirs stay in the shared temp dir (`PYTEST_DEBUG_TEMPROOT`), where pytest
    keeps the last three sessions' for a look after a failure; Ray's dirs too (`RAY_TMPDIR`): Ray
    puts unix sockets some 60 characters deep in its dir, and a socket path has at most 107.
    """
    shared = tempfile.gettempdir()
    _remove_session_dirs_of_dead_owners(Path(shared))
    private = Path(tempfile.mkdtemp(prefix=f"{SESSION_TEMP_DIR_PREFIX}{os.getpid()}_", dir=shared))
    os.environ[SESSION_TEMP_DIR_VARIABLE] = str(private)
    os.environ["TMPDIR"] = str(private)
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", shared)
    os.environ.setdefault("RAY_TMPDIR", shared)
    tempfile.tempdir = None  # `tempfile` read TMPDIR once already, in this process
    return private


def session_temp_dir() -> Path:
    """The test session's own temp dir (a test worker that made an engine points `tempfile` elsewhere: its run dir)."""
    return Path(os.environ[SESSION_TEMP_DIR_VARIABLE])


def listing() -> set[Path]:
    """Every top-level entry of the session's temp dir now, and those of /tmp and /dev/shm that could be ours."""
    entries = {
        entry
        for root in SHARED_ROOTS
        if root.is_dir()
        for entry in root.iterdir()
        if OURS_IN_SHARED_ROOTS.match(entry.name)
    }
    private = os.environ.get(SESSION_TEMP_DIR_VARIABLE)
    if private and Path(private).is_dir():
        entries |= set(Path(private).iterdir())
    return entries


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


def _remove_session_dirs_of_dead_owners(shared: Path) -> None:
    """Session temp dirs of test sessions that were killed before they could remove them."""
    for path in shared.glob(f"{SESSION_TEMP_DIR_PREFIX}*_*"):
        owner = path.name.removeprefix(SESSION_TEMP_DIR_PREFIX).split("_", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(path, ignore_errors=True)
