"""Placement by Ray: where each engine or worker actor runs and with what resources, and the Ray
instance of this process (joined, or started for the run and stopped with its last user).

The actors themselves: `ray_engine.RayEngine` (a vLLM engine) and `ray_dedicated_worker.DedicatedWorkerActor` (the
dedicated old-logit worker). Ray is an extra (`pip install "lit-asyncrl[ray]"`); nothing here
imports it before an actor starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import threading
import time
from pathlib import Path

from lit_asyncrl.rollout.processes.reaper import start_reaper, stop_reaper
from lit_asyncrl.rollout.processes.temp_dirs import make_ray_dir


@dataclasses.dataclass(frozen=True)
class RayPlacement:
    """Where and with what resources each engine actor runs.

    Args:
        address: the Ray cluster to join ("auto", "ray://host:10001"); None starts a local Ray
            instance for the run (and stops it at the end).
        num_cpus, num_gpus: each engine actor's resource request; fractions let several actors
            share a core (the tests run two engines on a 2-core machine with 0.5 each).
    """

    address: str | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0


class _RayRuntime:
    """Joins (or starts) Ray once per process; a Ray instance started here stops with its last user."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._started_here = False
        self._temp_dir: str | None = None
        self._reaper = None

    def acquire(self, address: str | None) -> None:
        import ray

        with self._lock:
            if not ray.is_initialized():
                if address is None:
                    # Its own short temp dir (socket paths must stay short), removed when it stops.
                    self._temp_dir = str(make_ray_dir())
                    # Should this process be killed outright, Ray's processes (its GCS server and
                    # raylet, their agents and the actors) would live on: its reaper ends them.
                    self._reaper = start_reaper([self._temp_dir])
                ray.init(
                    address=address,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level="ERROR",
                    configure_logging=False,
                    _temp_dir=self._temp_dir,
                )
                self._started_here = True
            self._users += 1

    def release(self) -> None:
        import ray

        with self._lock:
            self._users -= 1
            if self._users == 0 and self._started_here:
                started = _ray_processes_started_here()
                ray.shutdown()
                _wait_until_gone(started)
                self._started_here = False
                if self._temp_dir is not None:
                    _remove_dir_written_by_exiting_processes(self._temp_dir)
                    self._temp_dir = None
                stop_reaper(self._reaper)
                self._reaper = None


def _ray_processes_started_here() -> list:
    """The local Ray instance's processes (GCS server, raylet, workers): this process's descendants."""
    import psutil

    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            command = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "ray::" in command or "gcs_server" in command or "raylet" in command or "/ray/" in command:
            found.append(child)
    return found


def _wait_until_gone(processes: list, timeout_s: float = 15.0) -> None:
    """`ray.shutdown` asks its processes to stop and returns before they have: wait for them (the
    run must leave none behind), and kill what is still there after `timeout_s`."""
    import psutil

    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=5)


def _remove_dir_written_by_exiting_processes(path: str, timeout_s: float = 15.0) -> None:
    """Remove `path` while Ray's processes, told to stop, may still write their last log lines
    into it (one removal can race with them and leave the folder behind)."""
    deadline = time.monotonic() + timeout_s
    while Path(path).exists() and time.monotonic() < deadline:
        shutil.rmtree(path, ignore_errors=True)
        if Path(path).exists():
            time.sleep(0.2)


RAY_RUNTIME = _RayRuntime()
