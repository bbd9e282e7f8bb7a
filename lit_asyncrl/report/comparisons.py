"""What the seeds can and cannot tell apart: each run's held-out score per seed, and Welch's t-test
(unequal variances, two-sided) with a 95% interval for each pair of configurations the reader asks
about (`lit-asyncrl report --compare A B`, or `--baseline A` for every configuration against A).

A table of several comparisons is one family: beside each raw p stands its Holm-adjusted p over the
table's comparisons of the same quantity, and the verdict reads the adjusted one, so a table of ten
tests does not call a difference separated that one test in ten would show by chance. Where the two
configurations ran the same seeds (the same warm start, the same instances in the same order), the
paired test over the seeds' differences stands beside, as a second reading; the verdict stays Welch's.

A run's score at the end is its endpoint (`analysis_plan.Endpoint`): the last evaluation unless the
sweep's committed plan averages more."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

from lit_asyncrl.report.analysis_plan import Endpoint
from lit_asyncrl.report.runs import Run

#: The level below which a difference is called separated; the interval is the matching 95% one.
ALPHA = 0.05


def finished_or_all(runs: list[Run]) -> list[Run]:
    """The finished runs when there are any: a run cut short has no "end" (the tables' rule)."""
    return [run for run in runs if run.summary is not None] or runs


def per_seed_scores_table(groups: dict[str, list[Run]], avg_key: str, endpoint: Endpoint = Endpoint()) -> str:
    """Markdown: per configuration, each seed's held-out score at start -> endpoint, and the change's mean."""
    seeds = sorted({run.seed for runs in groups.values() for run in finished_or_all(runs)})
    k = avg_key.split("/")[1]
    header = ["configuration", *(f"seed {seed}: {k} start -> {endpoint.column()}" for seed in seeds), "mean change"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for label, members in groups.items():
        by_seed = {run.seed: run for run in finished_or_all(members)}
        cells = [label]
        changes = []
        for seed in seeds:
            run = by_seed.get(seed)
            start, end = (_start(run, avg_key), endpoint.score(run, avg_key)) if run else (None, None)
            if start is None or end is None:
                cells.append("–")
                continue
            cells.append(f"{start:.3f} -> {end:.3f}")
            changes.append(end - start)
        cells.append(f"{sum(changes) / len(changes):+.3f}" if changes else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def welch(first: Sequence[float], second: Sequence[float]) -> tuple[float, float, float, float, float]:
    """(mean difference first - second, its 95% interval's low and high ends, t, two-sided p) by
    Welch's t-test; needs two values or more on each side."""
    result = stats.ttest_ind(first, second, equal_var=False)
    interval = result.confidence_interval(1 - ALPHA)
    difference = sum(first) / len(first) - sum(second) / len(second)
    return difference, float(interval.low), float(interval.high), float(result.statistic), float(result.pvalue)


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family's p-values, in their order: the i-th smallest of m
    times m - i (from 0), never below the one before it in that order, at most 1.

    Written out rather than taken from statsmodels' `multipletests(method="holm")` (which gives the
    same values, checked in tests/test_report_comparisons.py): that one runs a full garbage
    collection on every call, 0.29 s on average in a process holding torch (measured over the 41
    calls of one `make test-fast`), which a report of many tables pays for each of them."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    tests_left = np.arange(len(p), 0, -1)
    stepped_down = np.maximum.accumulate(p[order] * tests_left)
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(stepped_down, 1.0)
    return adjusted.tolist()


def paired(first: dict[int, float], second: dict[int, float]) -> tuple[float, float, float, float, float] | None:
    """(mean of the per-seed differences first - second, its 95% interval's ends, t, two-sided p) by
    the paired t-test over the seeds both sides ran; None with fewer than two such seeds."""
    seeds = sorted(first.keys() & second.keys())
    if len(seeds) < 2:
        return None
    differences = [first[seed] - second[seed] for seed in seeds]
    result = stats.ttest_rel([first[seed] for seed in seeds], [second[seed] for seed in seeds])
    interval = result.confidence_interval(1 - ALPHA)
    return (
        sum(differences) / len(differences),
        float(interval.low),
        float(interval.high),
        float(result.statistic),
        float(result.pvalue),
    )


def comparisons_table(
    groups: dict[str, list[Run]], pairs: Sequence[tuple[str, str]], avg_key: str, endpoint: Endpoint = Endpoint()
) -> str:
    """Markdown: for each pair (A, B), A - B in held-out score at the endpoint and in its change
    from the start, each with a 95% Welch interval, t, p and the Holm-adjusted p over the table's
    pairs; the paired test of the endpoint over the seeds both ran, Holm-adjusted over the pairs
    that have one; and what the seeds say (by the Welch test's adjusted p at the endpoint).

    Raises:
        ValueError: naming a label no run has (the choices listed), or a side with fewer than two seeds.
    """
    k = avg_key.split("/")[1]
    at_end = endpoint.column()
    header = [
        "A",
        "B",
        "seeds A, B",
        f"{k} {at_end}, A - B [95% interval]",
        "t, p",
        "Holm p",
        f"change of {k}, A - B [95% interval]",
        "t, p",
        "Holm p",
        f"paired by seed: {k} {at_end}, A - B [95% interval]",
        "t, p",
        "Holm p",
        "at the end",
    ]
    scalars = (lambda run: endpoint.score(run, avg_key), lambda run: _change(run, avg_key, endpoint))
    tests = []  # per pair: (seeds on each side, Welch's result for each scalar, the paired result or None)
    for first, second in pairs:
        sides = [finished_or_all(_group(groups, label)) for label in (first, second)]
        results = [
            welch(*(_values(runs, scalar, label) for runs, label in zip(sides, (first, second)))) for scalar in scalars
        ]
        at_end = [{run.seed: scalars[0](run) for run in runs} for runs in sides]
        by_seed = [{seed: score for seed, score in scores.items() if score is not None} for scores in at_end]
        tests.append(([len(runs) for runs in sides], results, paired(*by_seed)))
    adjusted = [holm_adjusted([results[index][4] for _, results, _ in tests]) for index in range(len(scalars))]
    paired_rows = [row for row, (_, _, result) in enumerate(tests) if result is not None]
    paired_adjusted = dict(
        zip(paired_rows, holm_adjusted([tests[row][2][4] for row in paired_rows]) if paired_rows else [])
    )
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 3) + "---|"]
    for row, ((first, second), (seeds, results, paired_result)) in enumerate(zip(pairs, tests)):
        cells = [first, second, ", ".join(map(str, seeds))]
        for index, result in enumerate(results):
            cells += _test_cells(result, adjusted[index][row])
        cells += _test_cells(paired_result, paired_adjusted.get(row))
        end_difference = results[0][0]  # the score at the endpoint decides the verdict
        cells.append(
            f"{'A' if end_difference > 0 else 'B'} higher (Holm p < {ALPHA})"
            if adjusted[0][row] < ALPHA
            else f"not separable with {seeds[0]} and {seeds[1]} seeds"
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _test_cells(result: tuple[float, float, float, float, float] | None, holm_p: float | None) -> list[str]:
    if result is None:
        return ["–", "–", "–"]
    difference, low, high, t, p = result
    return [f"{difference:+.3f} [{low:+.3f}, {high:+.3f}]", f"{t:.2f}, {p:.3f}", f"{holm_p:.3f}"]


def _group(groups: dict[str, list[Run]], label: str) -> list[Run]:
    if label not in groups:
        raise ValueError(
            f"--compare/--baseline: no configuration {label!r}; the runs hold: {', '.join(map(repr, groups))}"
        )
    return groups[label]


def _values(runs: list[Run], scalar: Callable[[Run], float | None], label: str) -> list[float]:
    values = [value for value in map(scalar, runs) if value is not None]
    if len(values) < 2:
        raise ValueError(
            f"--compare/--baseline: {label!r} has {len(values)} run(s) with held-out scores; a test needs two or more"
        )
    return values


def _start(run: Run, key: str) -> float | None:
    values = run.values(key)
    return values[0] if values else None


def _change(run: Run, key: str, endpoint: Endpoint) -> float | None:
    start = _start(run, key)
    end = endpoint.score(run, key)
    return None if start is None or end is None else end - start
