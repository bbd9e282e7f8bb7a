"""What the seeds can and cannot tell apart: each run's held-out score per seed, and Welch's t-test
(unequal variances, two-sided) with a 95% interval for each pair of configurations the reader asks
about (`lit-asyncrl report --compare A B`, or `--baseline A` for every configuration against A)."""

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


def comparisons_table(groups: dict[str, list[Run]], pairs: Sequence[tuple[str, str]], avg_key: str) -> str:
    """Markdown: for each pair (A, B), A - B in held-out score at the end and in its change from the
    start, each with a 95% Welch interval, t and p, and what the seeds say.

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
        f"change of {k}, A - B [95% interval]",
        "t, p",
        "at the end",
    ]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for first, second in pairs:
        cells = [first, second]
        sides = [finished_or_all(_group(groups, label)) for label in (first, second)]
        cells.append(", ".join(str(len(runs)) for runs in sides))
        verdict = ""
        for scalar in (lambda run: run.last(avg_key), lambda run: _change(run, avg_key)):
            values = [_values(runs, scalar, label) for runs, label in zip(sides, (first, second))]
            difference, low, high, t, p = welch(*values)
            cells += [f"{difference:+.3f} [{low:+.3f}, {high:+.3f}]", f"{t:.2f}, {p:.3f}"]
            if not verdict:  # the first scalar, the score at the end, decides the verdict
                verdict = (
                    f"{'A' if difference > 0 else 'B'} higher (p < {ALPHA})"
                    if p < ALPHA
                    else f"not separable with {len(values[0])} and {len(values[1])} seeds"
                )
        cells.append(verdict)
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
