"""The environment that processes vLLM spawns start with, and the start method they are told."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Iterator, Mapping

import setproctitle

#: vLLM's choice of start method for the processes it starts ("fork" or "spawn").
START_METHOD_VARIABLE = "VLLM_WORKER_MULTIPROC_METHOD"


@contextlib.contextmanager
def spawned_process_environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in the environment while the block spawns processes (which read it at their start
    only); the caller's own values come back after the block, however it ends. One block at a time
    in a process: engines are made one after another (`engine.py`'s lock around their making)."""
    if values.get(START_METHOD_VARIABLE) == "fork":
        # vLLM titles its engine core with setproctitle, which at its first call in a process finds
        # the memory the title goes into through the environment's first string. Were that string
        # replaced here first (TMPDIR, in an environment that begins with it), a forked engine core
        # would keep this process's title, and nothing could find it by name (seen under Hydra's
        # parallel launcher). Only before a fork: the first call also moves this process's
        # environment strings and writes over the old ones, which a C library may still point at.
        setproctitle.getproctitle()
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
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
