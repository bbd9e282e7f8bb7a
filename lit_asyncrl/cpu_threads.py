"""How torch's idle CPU threads wait: asleep, so the trainer and the engine can share the cores.

torch runs CPU operators on an OpenMP thread pool, and GNU OpenMP keeps a pool's threads spinning
after each parallel region before they sleep (300,000 spins, a few milliseconds, when
`OMP_WAIT_POLICY` is unset). A run of this library is at least two busy processes on the same
cores, the trainer and each engine core, and a small policy's operators come thousands per step:
their threads spin between operators and take the cores the other process needs. Measured by
`benchmarks/bench_omp_wait_policy.py` (docs/benchmarks.md).
"""

from __future__ import annotations

import os


def let_idle_threads_sleep() -> None:
    """`OMP_WAIT_POLICY=PASSIVE` unless the user chose a policy.

    OpenMP reads it once, when the runtime loads with torch: effective only before torch is
    imported in this process; processes started later (engine cores, DDP ranks, Ray workers) inherit it.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
