"""The CPU engine's core process forked from the process that makes the engine, instead of spawned.

vLLM's CPU platform spawns the engine core. A spawned process starts a fresh interpreter that
imports vLLM, torch and the caller's `__main__` module again (for `python -m lit_asyncrl.train`:
Lightning and Hydra too) before it loads the model. A tiny-policy engine on a 2-core machine took
a median 13.9 s to start spawned against 7.5 s forked from a process that has those imports
already (`benchmarks/bench_engine.py`, 3 rounds). vLLM forks its engine core everywhere else
unless CUDA is initialized; the engine core made here runs its one worker in-process with one
OpenMP thread and is made from a thread of its own, so nothing of the parent's OpenMP pool is used
in the child.

What a spawned engine core takes from its environment as it starts, a forked one already has from
the parent: `settle_forked_engine_core` makes the child's state match the environment the engine
config asked for (one torch thread, no torch.compile, the run's temp dir, and the quiet console of
an ERROR log level); it also keeps the garbage collector off the copy of the parent's heap. A
forked child also holds a copy of every file descriptor of the parent, among them the pipe through
which another thread's `subprocess.Popen` learns that its child has exec'd: that `Popen` waits
until every copy of the pipe's write end is closed, so it would wait as long as the engine core
lives (seen: a customer's engine starting its reaper while the policy's engine
core was being forked). The child points every pipe it holds both ends of (one the parent was
using itself, never its own link to its parent) at /dev/null. vLLM's plugins already ran in the
parent, so it also arms the engine core's unnamed locks (`core_semaphores.py`); the fast
exit of `engine_core_exit.py` is not needed, since multiprocessing ends a forked child with
`os._exit` after its clean-up.

Setting vLLM's own `VLLM_WORKER_MULTIPROC_METHOD=spawn` keeps the spawned engine core.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing.util
import os
import tempfile
import warnings
from pathlib import Path

import torch

from lit_asyncrl.rollout.processes import core_semaphores
from lit_asyncrl.rollout.processes.core_exit import in_engine_core
from lit_asyncrl.rollout.processes.spawn_environment import START_METHOD_VARIABLE

#: Set in the environment of an engine core to fork: "quiet" (log level ERROR or above) or "1".
FORKED_VARIABLE = "LIT_ASYNCRL_ENGINE_CORE_FORKED"


def forked_engine_core_environment(quiet: bool) -> dict[str, str]:
    """Environment variables that make vLLM fork the next engine core it starts (held while it does)."""
    return {START_METHOD_VARIABLE: "fork", FORKED_VARIABLE: "quiet" if quiet else "1"}


def settle_forked_engine_core(_registered: object = None) -> None:
    """Run by multiprocessing in every child it starts; in an engine core forked by our engine
    config, apply what a spawned one reads from its environment at interpreter start."""
    mode = os.environ.get(FORKED_VARIABLE)
    if mode is None or not in_engine_core():
        return
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        # vLLM's sampler kernels were decorated with torch.compile when the parent imported them,
        # before the variable was set: run every compiled function eagerly.
        torch.compiler.set_stance("force_eager")
    _leave_the_parents_objects_to_the_exit()
    tempfile.tempdir = None  # read again from TMPDIR, the run's temp dir
    _release_the_parents_own_pipes()
    if mode == "quiet":
        warnings.simplefilter("ignore", FutureWarning)
        _quiet_cpp_warnings()
    core_semaphores.register()


def _leave_the_parents_objects_to_the_exit() -> None:
    """Keep the collector off the copy of the parent's heap: the engine core collects five times
    as it starts (after loading the model, before freezing its own heap) and once as it shuts down,
    and each walk over a trainer's heap (~720k objects) took ~0.5 s. Frozen here, those objects are
    never walked; vLLM's shutdown unfreezes everything it froze (so an engine made inside a
    process can free its memory), which would bring them back just before this process exits,
    so the unfreeze is left out here (measured on a trainer-sized heap: start 3.1 -> 1.2 s,
    shutdown 1.9 -> 0.7 s). The process's memory goes back with its exit, none of it by a finaliser."""
    gc.freeze()
    gc.unfreeze = _keep_frozen


def _keep_frozen() -> None:
    """`gc.unfreeze` in a forked engine core: nothing (see `_leave_the_parents_objects_to_the_exit`)."""


def _release_the_parents_own_pipes() -> None:
    """Point at /dev/null every inherited pipe of which this process holds a read end and a write end.

    Pointed, not closed: an inherited object that still owns such a descriptor may close it later,
    and a closed number could by then belong to a new file of this process."""
    ends: dict[str, list[tuple[int, bool]]] = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
            continue  # the console: never the parent's own pipe
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            flags = int(Path(f"/proc/self/fdinfo/{fd}").read_text().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError, ValueError):
            continue  # the listing's own descriptor, gone by now
        if target.startswith("pipe:"):
            ends.setdefault(target, []).append((fd, bool(flags & os.O_WRONLY)))
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for descriptors in ends.values():
            if {writes for _, writes in descriptors} == {False, True}:
                for fd, _ in descriptors:
                    os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def _quiet_cpp_warnings() -> None:
    """What `TORCH_CPP_LOG_LEVEL=ERROR` does at torch's start: the CPU worker's NUMA-binding notice
    (a C++ warning) would print under the progress bar at every engine start."""
    library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
    ctypes.c_int.in_dll(library, "FLAGS_caffe2_log_level").value = 2  # INFO 0, WARNING 1, ERROR 2


class _Registration:
    """The object multiprocessing keeps the after-fork hook under (its registry holds weak references)."""


_REGISTRATION = _Registration()
multiprocessing.util.register_after_fork(_REGISTRATION, settle_forked_engine_core)
