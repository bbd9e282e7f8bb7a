"""What the seeds can and cannot tell apart: each run's held-out score per seed, and Welch's t-test
(unequal variances, two-sided) with a 95% interval for each pair of configurations the reader asks
about (`lit-asyncrl report --compare A B`, or `--baseline A` for every configuration against A).

A table of several comparisons is one family: beside each raw p stands its Holm-adjusted p over the
table's comparisons of the same quantity, and the verdict reads the adjusted one, so a table of ten
tests does not call a difference separated that one test in ten would show by chance."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scipy import stats

from lit_asyncrl.report.runs import Run

#: The level below which a difference is called separated; the interval is the matching 95% one.
ALPHA = 0.05


def finished_or_all(runs: list[Run]) -> list[Run]:
    """The finished runs when there are any: a run cut short has no "end" (the tables' rule)."""
    return [run for run in runs if run.summary is not None] or runs


def per_seed_scores_table(groups: dict[str, list[Run]], avg_key: str) -> str:
    """Markdown: per configuration, each seed's held-out score at start -> end, and the change's mean."""
    seeds = sorted({run.seed for runs in groups.values() for run in finished_or_all(runs)})
    k = avg_key.split("/")[1]
    header = ["configuration", *(f"seed {seed}: {k} start -> end" for seed in seeds), "mean change"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for label, members in groups.items():
        by_seed = {run.seed: run for run in finished_or_all(members)}
        cells = [label]
        changes = []
        for seed in seeds:
            run = by_seed.get(seed)
            start, end = (_start(run, avg_key), run.last(avg_key)) if run else (None, None)
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
    """Holm's step-down adjustment of a family's p-values (statsmodels' `multipletests`), in their order."""
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(list(p_values), method="holm")[1]]


def comparisons_table(groups: dict[str, list[Run]], pairs: Sequence[tuple[str, str]], avg_key: str) -> str:
    """Markdown: for each pair (A, B), A - B in held-out score at the end and in its change from the
    start, each with a 95% Welch interval, t, p and the Holm-adjusted p over the table's pairs, and
    what the seeds say (by the adjusted p of the score at the end).

    Raises:
        ValueError: naming a label no run has (the choices listed), or a side with fewer than two seeds.
    """
    k = avg_key.split("/")[1]
    header = [
        "A",
        "B",
        "seeds A, B",
        f"{k} at end, A - B [95% interval]",
        "t, p",
        "Holm p",
        f"change of {k}, A - B [95% interval]",
        "t, p",
        "Holm p",
        "at the end",
    ]
    scalars = (lambda run: run.last(avg_key), lambda run: _change(run, avg_key))
    tests = []  # per pair: (seeds on each side, Welch's result for each scalar)
    for first, second in pairs:
        sides = [finished_or_all(_group(groups, label)) for label in (first, second)]
        results = [
            welch(*(_values(runs, scalar, label) for runs, label in zip(sides, (first, second)))) for scalar in scalars
        ]
        tests.append(([len(runs) for runs in sides], results))
    adjusted = [holm_adjusted([results[index][4] for _, results in tests]) for index in range(len(scalars))]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row, ((first, second), (seeds, results)) in enumerate(zip(pairs, tests)):
        cells = [first, second, ", ".join(map(str, seeds))]
        for index, (difference, low, high, t, p) in enumerate(results):
            cells += [
                f"{difference:+.3f} [{low:+.3f}, {high:+.3f}]",
                f"{t:.2f}, {p:.3f}",
                f"{adjusted[index][row]:.3f}",
            ]
        end_difference = results[0][0]  # the score at the end decides the verdict
        cells.append(
            f"{'A' if end_difference > 0 else 'B'} higher (Holm p < {ALPHA})"
            if adjusted[0][row] < ALPHA
            else f"not separable with {seeds[0]} and {seeds[1]} seeds"
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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


def _change(run: Run, key: str) -> float | None:
    start = _start(run, key)
    end = run.last(key)
    return None if start is None or end is None else end - start
