"""Helpers to launch the real entry points in a subprocess and read what they wrote."""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

from tests.support.preloaded_runs import REPO, run_preloaded

#: Each test engine's KV cache: 0.25 GiB (262,144 tokens of the tiny policy) is far more than a test
#: run uses. The default, a fifth of the RAM, takes about 8 s longer to start (measured: 17-18 s
#: against 9.8 s for an engine alone) and lets fewer engines share the machine.
SMALL_KV_CACHE_GIB = 0.25
SMALL_KV_CACHE = f"rollout.kv_cache_gib={SMALL_KV_CACHE_GIB}"
#: A small run: 4 groups of 4 episodes per batch keeps each step well under a second on CPU.
SMALL_RUN = [
    SMALL_KV_CACHE,
    "rollout.group_size=4",
    "rollout.groups_per_batch=4",
    "rollout.buffer_capacity=32",
    "rollout.max_concurrent_groups=4",
    "model.warm_start_steps=5",
]
#: Staleness needs the engine ahead of the trainer: more groups in flight than one batch.
#: 30 warm-start steps (as in the default run): the policy then writes valid guesses often enough
#: that groups have non-zero advantages, so the weights move between versions.
STALE_RUN = [
    "trainer.max_steps=8",
    *[o for o in SMALL_RUN if not o.startswith("model.warm_start_steps")],
    "model.warm_start_steps=30",
    "rollout.max_concurrent_groups=8",
]


def run_command(args: list[str], timeout_s: float = 600) -> subprocess.CompletedProcess:
    """`args` in a new process (a new interpreter for a Python entry point: what a user's console shows)."""
    result = subprocess.run(
        args, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    return succeeded(result)


def succeeded(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """`result`, or an AssertionError with both ends of its output if it failed."""
    args = result.args
    if result.returncode != 0:
        # Both ends of each stream: under DDP the first rank's report (the cause) comes first and the
        # other ranks' reports of the same failure fill the end.
        raise AssertionError(
            f"{' '.join(args)} failed ({result.returncode}):\n{_ends(result.stdout)}\n{_ends(result.stderr)}"
        )
    return result


def _ends(text: str, head: int = 3000, tail: int = 6000) -> str:
    return (
        text
        if len(text) <= head + tail
        else f"{text[:head]}\n[... {len(text) - head - tail} characters ...]\n{text[-tail:]}"
    )


def run_hydra(overrides: list[str], timeout_s: float = 600) -> subprocess.CompletedProcess:
    """`python -m lit_asyncrl.train overrides`, forked from the worker's preloaded interpreter."""
    return succeeded(run_preloaded("lit_asyncrl.train", overrides, timeout_s))


def run_cli(args: list[str], timeout_s: float = 600) -> subprocess.CompletedProcess:
    """`python -m lit_asyncrl.cli args` (the Lightning CLI), forked from the worker's preloaded interpreter."""
    return succeeded(run_preloaded("lit_asyncrl.cli", args, timeout_s))


def read_all_rows(csv_path: Path) -> list[dict[str, float]]:
    """Every row of a Lightning metrics.csv as floats (empty cells dropped); per-gap metrics are
    rows of their own (the module hands them to the loggers directly)."""
    with open(csv_path, newline="") as handle:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(handle)]


def read_rows(csv_path: Path) -> list[dict[str, float]]:
    """Rows of a Lightning metrics.csv that carry training metrics, as floats (empty cells dropped)."""
    return [row for row in read_all_rows(csv_path) if "train/task_success" in row]


def read_warm_start(run_dir: Path) -> list[dict[str, float]]:
    """The warm-start phase's rows (its own fit, logged to <run dir>/warm_start/metrics.csv)."""
    (csv_path,) = run_dir.glob("**/warm_start/metrics.csv")
    with open(csv_path, newline="") as handle:
        rows = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(handle)]
    return [row for row in rows if "warm_start/nll" in row]
