"""The environment that processes vLLM spawns start with, and the start method they are told."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
from collections.abc import Iterator, Mapping

_environment_lock = threading.Lock()
_environment_holders = 0
_environment_saved: dict[str, str | None] = {}


@contextlib.contextmanager
def spawned_process_environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in the environment while the block spawns processes (which read it at their start
    only); the caller's own values come back after the block, however it ends.

    Engines start on threads of their own at the same time, each with the same values: the first
    block in saves the caller's values and the last one out restores them, so no start sees them
    swapped back half-way and none is left behind.
    """
    global _environment_holders
    with _environment_lock:
        if _environment_holders == 0:
            _environment_saved.clear()
            _environment_saved.update({key: os.environ.get(key) for key in values})
        _environment_holders += 1
        os.environ.update(values)
    try:
        yield
    finally:
        with _environment_lock:
            _environment_holders -= 1
            if _environment_holders == 0:
                for key, value in _environment_saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value


def standard_start_method() -> None:
    """A process vLLM spawns is told this process's multiprocessing start method by name and sets
    it first thing. Inside a joblib worker (Hydra's parallel launcher) that name is 'loky', which a
    plain Python child cannot resolve: the engine core would die at birth. Use 'spawn' there."""
    if multiprocessing.get_start_method(allow_none=True) not in (None, "spawn", "fork", "forkserver"):
        multiprocessing.set_start_method("spawn", force=True)
