"""The runs committed under docs/results, read as the claims tests read them: grouped by what was run,
their endpoint and regime, and the paired comparisons of a report's configurations."""

from __future__ import annotations

import functools
import itertools
import re
import statistics
from pathlib import Path

from scipy import stats

from lit_asyncrl.report.comparisons import holm_adjusted
from lit_asyncrl.report.runs import Run, group_by_label, load_run

ROOT = Path(__file__).parents[2]
RESULTS = ROOT / "docs" / "results"
SCORE = "val/avg@4"


@functools.cache
def groups(report: str) -> dict[str, list[Run]]:
    runs = sorted((RESULTS / report / "runs").iterdir())
    if report == "fig4_regime":  # its arm without the reset is Figure 10's W/(W+2), as its report command takes it
        runs += sorted((RESULTS / "fig10_regime" / "runs").glob("*reference.beta=null*"))
    return group_by_label([load_run(path) for path in runs if path.is_dir()])


def end(run: Run) -> float:
    return run.last(SCORE)


@functools.cache
def paired_family(report: str) -> dict[frozenset, tuple[float, float]]:
    """Every pair of the report's configurations, paired by seed: {pair: (mean per-seed difference of
    the first minus the second, Holm p over all pairs of the paired t-test's p)}."""
    labelled = groups(report)
    pairs = list(itertools.combinations(labelled, 2))
    tests = []
    for first, second in pairs:
        by_seed = [{run.seed: end(run) for run in labelled[label]} for label in (first, second)]
        seeds = sorted(by_seed[0].keys() & by_seed[1].keys())
        values = [[side[seed] for seed in seeds] for side in by_seed]
        difference = sum(a - b for a, b in zip(*values)) / len(seeds)
        tests.append((difference, float(stats.ttest_rel(*values).pvalue)))
    adjusted = holm_adjusted([p for _, p in tests])
    return {frozenset(pair): (difference, holm) for pair, (difference, _), holm in zip(pairs, tests, adjusted)}


def compare_paired(report: str, first: str, second: str) -> tuple[float, float]:
    """(first - second, paired Holm p) in the report's all-pairs family."""
    difference, holm = paired_family(report)[frozenset((first, second))]
    order = list(groups(report))
    return (difference if order.index(first) < order.index(second) else -difference), holm


def regime(run: Run) -> float:
    """The run's drift per version over its train-inference discrepancy (each the mean over its steps)."""
    drift = statistics.fmean(run.values("fidelity/version_drift_absmean"))
    return drift / statistics.fmean(run.values("fidelity/discrepancy_absmean"))


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)
