"""A vLLM plugin: the engine core's locks leave no file in /dev/shm, however the process ends.

An engine core makes two multiprocessing locks as it starts (the single-process executor's
`shared_worker_lock` and tqdm's lock for the weight-loading bar). Under the spawn start method,
which vLLM's engine core inherits from the trainer, each is a named POSIX semaphore: a file
`/dev/shm/sem.mp-*` that lives until the lock's finalizer or multiprocessing's resource tracker
unlinks it. An engine core killed together with its tracker leaves the file for good (seen once in
a whole test run: Ray kills an actor's child processes, a SIGKILLed run's processes die together).

Under the fork start method Python unlinks the name as soon as the semaphore is open, so the lock
works as before and no file ever exists. Setting it changes nothing else here: an engine core that
is one process (the CPU engine) starts no process, and vLLM's executors that do start workers name
their start method explicitly (`VLLM_WORKER_MULTIPROC_METHOD`), so the default is never used to
start one.

Armed where `rollout/engine/settings.py` asks for it (an environment variable), and only in the
engine-core process; vLLM runs plugins as the process starts, before its executor exists.
"""

from __future__ import annotations

import multiprocessing
import os

from lit_asyncrl.rollout.processes.core_exit import in_engine_core

#: Set (to "1") in the environment of the engine-core process whose locks should be unnamed.
UNNAMED_LOCKS_VARIABLE = "LIT_ASYNCRL_ENGINE_CORE_UNNAMED_LOCKS"


def register() -> None:
    """vLLM plugin hook (run in every vLLM process): in an engine core that asked, locks made from
    now on are unlinked semaphores."""
    if os.environ.get(UNNAMED_LOCKS_VARIABLE) == "1" and in_engine_core():
        multiprocessing.set_start_method("fork", force=True)
