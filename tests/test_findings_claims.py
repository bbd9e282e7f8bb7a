"""The numbers the prose of docs/findings.md states about the committed runs, recomputed from those runs.

Each claim is the sentence's text with its numbers rendered from the committed data (Welch's t-test over
seeds, Holm's adjustment over every pair of the report's configurations, counts over runs); the test
finds it in the document, whitespace aside. A sentence whose number drifts from its data fails here.
"""

from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path

import pytest
from scipy import stats

from lit_asyncrl.report.comparisons import holm_adjusted
from lit_asyncrl.report.runs import Run, group_by_label, load_run

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "docs" / "results"
SCORE = "val/avg@4"
#: Figure 10's decays, as the report labels them.
DECAY = {beta: f"ppo_ewma_no_reset reference.beta={beta}" for beta in ("0.9", "0.75", "null", "0.5")}


@functools.cache
def groups(report: str) -> dict[str, list[Run]]:
    runs = sorted((RESULTS / report / "runs").iterdir())
    return group_by_label([load_run(path) for path in runs if path.is_dir()])


def end(run: Run) -> float:
    return run.last(SCORE)


def change(run: Run) -> float:
    return run.last(SCORE) - run.values(SCORE)[0]


def at_evaluation(index: int):
    return lambda run: run.values(SCORE)[index]


def last_two(run: Run) -> float:
    return sum(run.values(SCORE)[-2:]) / 2


@functools.cache
def family(report: str, scalar=end) -> dict[frozenset, tuple[float, float, float]]:
    """Every pair of the report's configurations: {pair: (mean of the first minus the second, raw p,
    Holm p over all pairs)}, the first of a pair in the report's order."""
    labelled = groups(report)
    pairs = list(itertools.combinations(labelled, 2))
    tests = []
    for first, second in pairs:
        values = [[scalar(run) for run in labelled[label]] for label in (first, second)]
        difference = sum(values[0]) / len(values[0]) - sum(values[1]) / len(values[1])
        tests.append((difference, float(stats.ttest_ind(*values, equal_var=False).pvalue)))
    adjusted = holm_adjusted([p for _, p in tests])
    return {frozenset(pair): (*test, holm) for pair, test, holm in zip(pairs, tests, adjusted)}


def compare(report: str, first: str, second: str, scalar=end) -> tuple[float, float, float]:
    """(first - second, raw p, Holm p) in the report's all-pairs family."""
    difference, p, holm = family(report, scalar)[frozenset((first, second))]
    order = list(groups(report))
    return (difference if order.index(first) < order.index(second) else -difference), p, holm


def raw_p(report: str, first: str, second: str, scalar) -> float:
    values = [[scalar(run) for run in groups(report)[label]] for label in (first, second)]
    return float(stats.ttest_ind(*values, equal_var=False).pvalue)


def same(values, digits: int = 3) -> str:
    """The one value `values` show at `digits` decimals; several (which the prose's "each" denies)
    joined, so the claim cannot match."""
    return " / ".join(sorted({f"{value:.{digits}f}" for value in values}))


def table2_claims() -> list[str]:
    t2 = functools.partial(compare, "table2_regime")
    snap_async, int_async, b075_async = (
        t2("snapshot", "decoupled_async"),
        t2("interrupt_sync", "decoupled_async"),
        t2("ppo_ewma_beta075", "decoupled_async"),
    )
    below_snapshot = [t2("snapshot", other) for other in ("linear_prox_train_infer", "ppo_ewma", "ppo_ewma_beta075")]
    below_interrupt = [
        t2("interrupt_sync", other) for other in ("linear_prox_train_infer", "ppo_ewma", "ppo_ewma_beta075")
    ]
    lost = [t2("snapshot", other, change) for other in ("ppo_ewma", "ppo_ewma_beta075", "linear_prox_train_infer")]
    among = [t2("ppo_ewma_beta075", "ppo_ewma"), t2("ppo_ewma_beta075", "linear_prox_train_infer")]
    rest = [
        t2("ppo_ewma", "linear_prox_train_infer"),
        t2("ppo_ewma", "decoupled_async"),
        t2("linear_prox_train_infer", "decoupled_async"),
    ]
    exact_routes = t2("snapshot", "interrupt_sync")
    endpoint = [
        raw_p("table2_regime", "snapshot", "ppo_ewma_beta075", scalar) for scalar in (end, at_evaluation(2), last_two)
    ]
    changes = [change(run) for label, runs in groups("table2_regime").items() for run in runs]
    proxies = [
        change(run)
        for label, runs in groups("table2_regime").items()
        if label not in ("snapshot", "interrupt_sync")
        for run in runs
    ]
    linear = [change(run) for run in groups("table2_regime")["linear_prox_train_infer"]]
    assert len(changes) == 30 and sum(c > 0 for c in proxies) == sum(c > 0 for c in linear)
    return [
        f"snapshot above it by {snap_async[0]:.3f} (p = {snap_async[1]:.4f}, Holm {snap_async[2]:.3f}), "
        f"interrupt-sync by {int_async[0]:.3f} (p = {int_async[1]:.4f}, Holm {int_async[2]:.3f}), "
        f"EWMA 0.75 by {b075_async[0]:.3f} (p = {b075_async[1]:.4f}, Holm {b075_async[2]:.3f}).",
        f"linear interpolation {below_snapshot[0][0]:.3f} below snapshot (p = {below_snapshot[0][1]:.3f}, "
        f"Holm {below_snapshot[0][2]:.2f}), the paper's EWMA {below_snapshot[1][0]:.3f} (p = {below_snapshot[1][1]:.3f}, "
        f"Holm {below_snapshot[1][2]:.2f}), EWMA 0.75 {below_snapshot[2][0]:.3f} (p = {below_snapshot[2][1]:.3f}, "
        f"Holm {below_snapshot[2][2]:.2f}); below interrupt-sync by {below_interrupt[0][0]:.3f}, "
        f"{below_interrupt[1][0]:.3f} and {below_interrupt[2][0]:.3f} (Holm "
        f"{min(c[2] for c in below_interrupt):.2f} to {max(c[2] for c in below_interrupt):.2f}).",
        f"the paper's EWMA and EWMA 0.75 lost {lost[0][0]:.3f} and {lost[1][0]:.3f} against snapshot "
        f"(p = {same(c[1] for c in lost[:2])} each, Holm {same(c[2] for c in lost[:2])} each: held), "
        f"linear {lost[2][0]:.3f} (Holm {lost[2][2]:.2f}).",
        f"snapshot against EWMA 0.75 gives p = {endpoint[0]:.3f} at step 119, {endpoint[1]:.2f} at step 79 and "
        f"{endpoint[2]:.2f} on the mean of the last two evaluations.",
        f"(snapshot - interrupt_sync at the end: {exact_routes[0]:.3f}, p = {exact_routes[1]:.2f})",
        f"EWMA 0.75 against the paper's W/(W+2) {among[0][0]:+.3f} (p = {among[0][1]:.2f}, Holm {among[0][2]:.2f}) "
        f"and against linear interpolation {among[1][0]:+.3f} (p = {among[1][1]:.2f}, Holm {among[1][2]:.2f}), "
        f"the paper's EWMA against linear {rest[0][0]:+.3f} and against async recompute {rest[1][0]:+.3f}, "
        f"linear against async recompute {rest[2][0]:+.3f} (Holm {same((c[2] for c in rest), digits=1)} each)",
        f"the proxies fell in {sum(c < 0 for c in proxies)} of their {len(proxies)} runs (linear interpolation "
        f"rose in {sum(c > 0 for c in linear)} of its {len(linear)} seeds)",
    ]


def figure10_claims() -> list[str]:
    f10 = functools.partial(compare, "fig10_regime")
    high_low, high_low_change = f10(DECAY["0.9"], DECAY["0.5"]), f10(DECAY["0.9"], DECAY["0.5"], change)
    mid_low, high_mid = f10(DECAY["0.75"], DECAY["0.5"]), f10(DECAY["0.9"], DECAY["0.75"])
    mid_paper, mid_paper_change = f10(DECAY["0.75"], DECAY["null"]), f10(DECAY["0.75"], DECAY["null"], change)
    paper_low, high_paper = f10(DECAY["null"], DECAY["0.5"]), f10(DECAY["0.9"], DECAY["null"])
    return [
        f"0.9 ended {high_low[0]:.3f} above 0.5 (Welch p = {high_low[1]:.3f}, Holm {high_low[2]:.3f} over all "
        f"{len(family('fig10_regime'))} pairs",
        f"in the change from the start {high_low_change[0]:+.3f}, p = {high_low_change[1]:.3f}, "
        f"Holm {high_low_change[2]:.2f})",
        f"0.75 against 0.5 {mid_low[0]:+.3f} (p = {mid_low[1]:.3f}, Holm {mid_low[2]:.2f}) and 0.9 against 0.75 "
        f"{high_mid[0]:+.3f} (p = {high_mid[1]:.2f})",
        f"0.75 against W/(W+2) at the end {mid_paper[0]:+.3f} (p = {mid_paper[1]:.3f}, Holm {mid_paper[2]:.2f}; in "
        f"the change {mid_paper_change[0]:+.3f}, p = {mid_paper_change[1]:.3f}, Holm {mid_paper_change[2]:.2f}), "
        f"W/(W+2) against 0.5 {paper_low[0]:+.3f} (p = {paper_low[1]:.2f}, Holm {paper_low[2]:.2f}), 0.9 against "
        f"W/(W+2) {high_paper[0]:+.3f} (p = {high_paper[1]:.2f}, Holm {high_paper[2]:.2f})",
    ]


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


FINDINGS = flat((ROOT / "docs" / "findings.md").read_text())


@pytest.mark.parametrize("claims", [table2_claims, figure10_claims], ids=["table2_regime", "fig10_regime"])
def test_the_prose_states_what_the_committed_runs_give(claims):
    # Computed here, not at collection: only the worker that runs the test loads the runs.
    assert [claim for claim in claims() if flat(claim) not in FINDINGS] == []
