"""Every file vLLM makes for a run lives in dirs of the run's own, which every way out removes.

vLLM leaves files in the temp dir that nothing removes: the ZMQ sockets between the trainer and
each engine core (bare uuids under `VLLM_RPC_BASE_PATH`, by default the temp dir of the process
that makes the engine: the trainer's), the gloo rendezvous file of its workers (`vllm_dist_<uuid>`,
in the engine core's temp dir) and torch's compile cache for the sampler's kernels. So:

- the process that makes engines gets one run dir (`lit_asyncrl_run_<pid>_*`), where vLLM's IPC
  paths, the engine cores' temp dir and this process's own `tempfile` dir point, removed when the
  process exits;
- each engine gets a weights dir of its own (`lit_asyncrl_weights_<pid>_*`) for its weight files,
  removed by its shutdown.

Both live in /dev/shm where it is writable (weights stay in memory). After a SIGKILL nothing in the
dead process runs: its engines' reapers remove both dirs, and the next run removes the dirs of
owners that are gone.
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

WEIGHTS_DIR_PREFIX = "lit_asyncrl_weights_"
RUN_DIR_PREFIX = "lit_asyncrl_run_"
RAY_DIR_PREFIX = "lit_asyncrl_ray_"
#: The temp dir this process had before its run dir replaced it.
_ORIGINAL_TEMP_DIR = tempfile.gettempdir()
_run_dir: Path | None = None
_run_dir_lock = threading.Lock()


def run_dir() -> Path:
    """This process's run dir, made on first use; this process's `tempfile` points there from then
    on (vLLM's gloo rendezvous file, when it makes one on this side, goes to `tempfile`'s dir)."""
    global _run_dir
    with _run_dir_lock:
        if _run_dir is None or not _run_dir.is_dir():
            remove_dirs_of_dead_owners()
            _run_dir = Path(tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}_", dir=_root()))
            # Removed at exit after multiprocessing's own temp dir (`pymp-*`, made here once `tempfile`
            # points here), which its exit function removes with priority -100: an `atexit` handler of
            # ours would run first and that removal would print a FileNotFoundError traceback.
            multiprocessing.util.Finalize(
                None, shutil.rmtree, args=(str(_run_dir),), kwargs={"ignore_errors": True}, exitpriority=-200
            )
            # Also when this process ends without its exit handlers (killed, or an exit that skips
            # them): a reaper of its own removes the dir once the process is gone.
            from lit_asyncrl.rollout.processes.reaper import start_reaper

            start_reaper([_run_dir])
            tempfile.tempdir = str(_run_dir)
        return _run_dir


def remove_run_dir() -> None:
    """Remove this process's run dir now, for a process that ends without its exit handlers: a Ray
    actor is killed (`ray.kill`) once its engine is shut down, and Ray kills the actor's children,
    the run dir's reaper among them, with it."""
    global _run_dir
    with _run_dir_lock:
        if _run_dir is not None:
            shutil.rmtree(_run_dir, ignore_errors=True)
            tempfile.tempdir = _ORIGINAL_TEMP_DIR
            _run_dir = None


def engine_environment() -> dict[str, str]:
    """Environment variables to hold while an engine is made: vLLM reads `VLLM_RPC_BASE_PATH` in this
    process when it picks the paths of the engine core's sockets, and the engine core, spawned then,
    keeps `TMPDIR` for the files it makes later. Other processes this one starts keep the caller's
    temp dir (a run dir of ours, inherited, would be removed under them)."""
    return {"VLLM_RPC_BASE_PATH": str(run_dir()), "TMPDIR": str(run_dir())}


def make_weights_dir() -> Path:
    """A new dir for one engine's weight files, named after this process."""
    remove_dirs_of_dead_owners()
    return Path(tempfile.mkdtemp(prefix=f"{WEIGHTS_DIR_PREFIX}{os.getpid()}_", dir=_root()))


def make_ray_dir() -> Path:
    """A new temp dir for a local Ray instance, directly in Ray's temp root (`ray_root`): Ray puts
    unix sockets some 60 characters deep in it, and a socket path has at most 107."""
    remove_dirs_of_dead_owners()
    return Path(tempfile.mkdtemp(prefix=f"{RAY_DIR_PREFIX}{os.getpid()}_", dir=ray_root()))


def ray_root() -> str:
    """Where Ray's dirs go: `RAY_TMPDIR` when set (Ray's own setting for a temp dir whose path is too
    long for its sockets), else the temp dir this process started with."""
    return os.environ.get("RAY_TMPDIR") or _ORIGINAL_TEMP_DIR


def remove_dirs_of_dead_owners() -> None:
    """Run, weights and Ray dirs whose owner process is gone (killed before it could clean up)."""
    _remove_dirs_whose_owner(lambda owner: not Path(f"/proc/{owner}").exists())


def remove_dirs_of(owners: set[int]) -> None:
    """Run, weights and Ray dirs made by the processes `owners` (killed by a reaper)."""
    _remove_dirs_whose_owner(lambda owner: owner in owners)


def _remove_dirs_whose_owner(condition: Callable[[int], bool]) -> None:
    for root in {_root(), _ORIGINAL_TEMP_DIR, ray_root()}:
        for prefix in (WEIGHTS_DIR_PREFIX, RUN_DIR_PREFIX, RAY_DIR_PREFIX):
            for path in Path(root).glob(f"{prefix}*_*"):
                owner = path.name.removeprefix(prefix).split("_", 1)[0]
                if owner.isdigit() and condition(int(owner)):
                    shutil.rmtree(path, ignore_errors=True)


def _root() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else _ORIGINAL_TEMP_DIR
