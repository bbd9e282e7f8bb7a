"""Statistics over seeds: curves with a band, and per-run scalars with mean and spread."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from lit_asyncrl.losses.metrics import GAP_BUCKETS
from lit_asyncrl.report.runs import Run


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over `window` points (the first points average what exists)."""
    if window <= 1:
        return list(values)
    out = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


def seed_band(runs: list[Run], key: str, window: int = 1) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps, mean, min, max) over the seeds that logged `key` at each step, smoothed per seed.

    A seed that stopped early (killed, still running) leaves the later steps to the others.
    """
    per_seed: list[dict[int, float]] = []
    for run in runs:
        points = [(step, value) for step, value in run.series.get(key, []) if math.isfinite(value)]
        if points:
            steps, values = zip(*points)
            per_seed.append(dict(zip(steps, smooth(values, window))))
    steps = sorted(set().union(*per_seed)) if per_seed else []
    columns = [[seed[step] for seed in per_seed if step in seed] for step in steps]
    return steps, [statistics.fmean(c) for c in columns], [min(c) for c in columns], [max(c) for c in columns]


def mean_and_spread(values: Sequence[float]) -> tuple[float, float] | None:
    """(mean, sample standard deviation) of the seeds' values; spread 0 for one seed; None for none."""
    values = [value for value in values if value is not None and math.isfinite(value)]
    if not values:
        return None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def per_seed(runs: list[Run], scalar: Callable[[Run], float | None]) -> tuple[float, float] | None:
    return mean_and_spread([scalar(run) for run in runs])


def final_value(key: str) -> Callable[[Run], float | None]:
    return lambda run: run.last(key)


def first_value(key: str) -> Callable[[Run], float | None]:
    return lambda run: run.values(key)[0] if run.values(key) else None


def lowest_value(key: str) -> Callable[[Run], float | None]:
    return lambda run: min(run.values(key)) if run.values(key) else None


def mean_value(key: str) -> Callable[[Run], float | None]:
    return lambda run: statistics.fmean(run.values(key)) if run.values(key) else None


def median_value(key: str) -> Callable[[Run], float | None]:
    return lambda run: statistics.median(run.values(key)) if run.values(key) else None


def wall_minutes(run: Run) -> float | None:
    return run.summary["wall_s"] / 60 if run.summary else None


def fidelity_per_gap(runs: list[Run]) -> list[tuple[float, float] | None]:
    """Per version-gap bucket: mean and spread over seeds of the run's mean |log pi_proxy - log pi_old|."""
    return [per_seed(runs, mean_value(f"fidelity/logratio_absmean/{bucket}")) for bucket in GAP_BUCKETS]
