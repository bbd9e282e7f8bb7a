"""The numbers the prose and tables of docs/findings.md state about the committed runs, recomputed from
those runs (the rerun of Table 2's decisive arms and the README's findings sentence: test_decisive_claims.py).

Each claim is the sentence's (or table row's) text with its numbers rendered from the committed data
(Welch's and the paired t-test over seeds, Holm's adjustment over every pair of the report's
configurations, means, spreads and counts over runs); the test finds it in the document, whitespace
aside. A sentence whose number drifts from its data fails here. The miniature findings' runs were not
kept: their comparisons are recomputed from their committed report's means and spreads or from the
per-seed values their tables state.
"""

from __future__ import annotations

import functools
import itertools
import statistics

import pytest
from scipy import stats

from lit_asyncrl.report.comparisons import holm_adjusted
from lit_asyncrl.report.runs import Run
from tests.support.committed_runs import RESULTS, ROOT, SCORE, compare_paired, end, flat, groups
from tests.support.report_runs import table_rows

#: Figure 10's decays, as the report labels them.
DECAY = {beta: f"ppo_ewma_no_reset reference.beta={beta}" for beta in ("0.9", "0.75", "null", "0.5")}


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
    proxies_named = ("linear_prox_train_infer", "ppo_ewma", "ppo_ewma_beta075")
    paired_interrupt = [compare_paired("table2_regime", "interrupt_sync", other) for other in proxies_named]
    paired_snapshot = [compare_paired("table2_regime", "snapshot", other) for other in proxies_named]
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
        f"interrupt-sync above linear interpolation, the paper's EWMA and EWMA 0.75 by "
        f"{paired_interrupt[0][0]:.3f}, {paired_interrupt[1][0]:.3f} and {paired_interrupt[2][0]:.3f} (paired Holm "
        f"{paired_interrupt[0][1]:.3f}, {paired_interrupt[1][1]:.3f} and {paired_interrupt[2][1]:.3f}), snapshot "
        f"above linear interpolation and the paper's EWMA by {paired_snapshot[0][0]:.3f} and "
        f"{paired_snapshot[1][0]:.3f} (paired Holm {paired_snapshot[0][1]:.3f} and {paired_snapshot[1][1]:.3f}) "
        f"but not separable from EWMA 0.75 ({paired_snapshot[2][0]:.3f}, paired Holm {paired_snapshot[2][1]:.2f})",
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


def figure4_claims() -> list[str]:
    f4 = functools.partial(compare, "fig4_regime")
    high, low, none = (
        "ppo_ewma reference.tau=0.82",
        "ppo_ewma reference.tau=0.73",
        "ppo_ewma_no_reset reference.beta=null",
    )
    high_low, high_none, low_none = f4(high, low), f4(high, none), f4(low, none)
    low_none_change = f4(low, none, change)
    starts = [statistics.fmean(run.values(SCORE)[0] for run in groups("fig4_regime")[label]) for label in (low, none)]
    return [
        f"tau 0.82 against tau 0.73 {high_low[0]:+.3f} (p = {high_low[1]:.2f}, Holm {high_low[2]:.2f} over the "
        f"{len(family('fig4_regime'))} pairs), tau 0.82 against no reset {high_none[0]:+.3f} (p = {high_none[1]:.2f}, "
        f"Holm {high_none[2]:.2f}), tau 0.73 against no reset {low_none[0]:+.3f} (p = {low_none[1]:.3f}, Holm "
        f"{low_none[2]:.2f}; in the change {low_none_change[0]:+.3f}, p = {low_none_change[1]:.3f}, Holm "
        f"{low_none_change[2]:.2f})",
        f"they ended {abs(low_none[0]):.3f} apart (p = {low_none[1]:.2f}), from {abs(starts[0] - starts[1]):.3f} "
        "apart at the start",
    ]


def table_row(
    runs: list[Run], bold: bool = False, rose: bool = False, per_seed: bool = False, mask: bool = True
) -> str:
    """A method's row in the document's tables, from its runs: held-out start -> end (mean ± sd),
    optionally each seed's end, the mean change, optionally the seeds that rose, and the lowest mask
    (mean over seeds of each run's lowest; Figure 4's table has the resets before it)."""
    starts, ends = [run.values(SCORE)[0] for run in runs], [end(run) for run in runs]
    end_text = f"{statistics.fmean(ends):.3f} ± {statistics.stdev(ends):.3f}"
    cells = [f"{statistics.fmean(starts):.3f} -> " + (f"**{end_text}**" if bold else end_text)]
    if per_seed:
        cells.append(" ".join(f"{value:.3f}" for value in ends))
    cells.append(f"{statistics.fmean(change(run) for run in runs):+.3f}")
    if rose:
        cells.append(f"{sum(change(run) > 0 for run in runs)} of {len(runs)}")
    if mask:
        cells.append(f"{statistics.fmean(min(run.values('train/train_infer_mask')) for run in runs):.3f}")
    return " | ".join(cells)


def table_claims() -> list[str]:
    table2, fig10, fig4 = groups("table2_regime"), groups("fig10_regime"), groups("fig4_regime")
    resets = [run.last("reference/ewma_resets") for run in fig4["ppo_ewma reference.tau=0.82"]]
    exact = ("snapshot", "interrupt_sync")
    return [
        *(f"{table_row(table2[label], bold=label in exact, rose=True)} |" for label in table2),
        *(
            f"| {beta} | {table_row(fig10[DECAY[beta]], bold=beta == '0.75', per_seed=True)} |"
            for beta in ("0.9", "0.75", "0.5")
        ),
        f"| W/(W+2) = 0.6 | {table_row(fig10[DECAY['null']], per_seed=True)} |",
        f"| reset at tau 0.82 | {table_row(fig4['ppo_ewma reference.tau=0.82'], per_seed=True, mask=False)} | "
        f"{statistics.fmean(resets):.1f} ± {statistics.stdev(resets):.1f} |",
    ]


def document_row(document: str, start: str) -> list[str]:
    """The cells of the markdown table row of `document` that starts with `start`."""
    (line,) = [line for line in document.splitlines() if line.startswith(start)]
    return line.strip("| ").split(" | ")


def ends_per_seed(row: list[str]) -> list[float]:
    """The per-seed values at the end from a "per seed at steps 40 / 120" cell of a miniature table."""
    cell = next(cell for cell in row if " / " in cell and cell[0].isdigit())
    return [float(value) for value in cell.split(" / ")[1].split()]


def welch_from_seeds(first: list[float], second: list[float]) -> tuple[float, float, float]:
    result = stats.ttest_ind(first, second, equal_var=False)
    return float(result.statistic), float(result.df), float(result.pvalue)


def miniature_claims() -> list[str]:
    """The miniature findings' comparisons: their runs were not kept, so Table 2's come from its
    committed report's means and spreads, Figures 3 and 4's from the per-seed values of their tables."""
    report = (RESULTS / "findings" / "table2" / "report.md").read_text()
    summary = {}
    for row in table_rows(report)[1:]:
        mean, _, spread = row[3].partition(" ± ")
        summary[row[0]] = (float(mean), float(spread or 0.0))
    exact = ("snapshot", "interrupt_sync", "dedicated")
    proxies = ("ppo_ewma", "linear_prox_train_infer", "decoupled_async", "loglinear_prox_train_infer")
    pairs = [(route, proxy) for route in exact for proxy in proxies]
    raw = [
        float(stats.ttest_ind_from_stats(*summary[route], 3, *summary[proxy], 3, equal_var=False).pvalue)
        for route, proxy in pairs
    ]
    holm = dict(zip(pairs, holm_adjusted(raw)))
    raw = dict(zip(pairs, raw))
    collapsed = [holm[pair] for pair in pairs if pair[1] == "loglinear_prox_train_infer"]
    others = [pair for pair in pairs if pair[1] != "loglinear_prox_train_infer"]
    spreads = [summary[proxy][1] for proxy in proxies[:3]]
    document = (ROOT / "docs" / "findings.md").read_text()
    no_reset, tau08, tau09 = (
        ends_per_seed(document_row(document, f"| {arm}"))
        for arm in ("none (`ppo_ewma_no_reset`)", "tau 0.8 (`ppo_ewma`)", "tau 0.9 (`ppo_ewma_tau09`)")
    )
    fig4 = [welch_from_seeds(*pair) for pair in ((tau09, no_reset), (tau08, no_reset), (tau08, tau09))]
    fig4_holm = holm_adjusted([p for _, _, p in fig4])
    strict, loose = (
        [ends_per_seed(document_row(document, f"| {mask} | {clip}")) for clip in ("[0.95, 1.05]", "[0.8, 1.28]")]
        for mask in ("[0.99, 1.01]", "[0.9, 1.1]")
    )
    fig3 = [welch_from_seeds(*strict), welch_from_seeds(*loose)]
    fig3_holm = holm_adjusted([p for _, _, p in fig3])
    return [
        f"with Holm over the {len(pairs)} pairs of an exact route and a proxy, each exact route ended above "
        f"log-linear interpolation (Holm {min(collapsed):.3f} to {max(collapsed):.3f}; it collapsed in every seed), "
        f"and none is separable from EWMA 0.75, linear interpolation or async recompute with 3 seeds (Holm "
        f"{min(holm[pair] for pair in others):.2f} to {max(holm[pair] for pair in others):.2f}; raw p "
        f"{min(raw[pair] for pair in others):.3f} to {max(raw[pair] for pair in others):.3f}), whose collapses "
        f"in some seeds and not others leave spreads of {min(spreads):.3f} to {max(spreads):.3f}.",
        f"tau 0.9 against no reset Welch t = {fig4[0][0]:.1f} on {fig4[0][1]:.1f} degrees of freedom from the "
        f"per-seed values above, p = {fig4[0][2]:.3f}, Holm {fig4_holm[0]:.2f} over the 3 pairs; tau 0.8 against "
        f"no reset and against tau 0.9, t = {fig4[1][0]:.1f} and {fig4[2][0]:.1f} (Holm "
        f"{same(fig4_holm[1:], digits=2)} each).",
        f"Welch t = {fig3[1][0]:.1f}, p = {fig3[1][2]:.2f}); under the strict mask it ended higher",
        f"not separable with 3 seeds either (t = {fig3[0][0]:.1f} on {fig3[0][1]:.1f} degrees of freedom from the per-seed values in "
        f"the table, p = {fig3[0][2]:.3f}, Holm {fig3_holm[0]:.2f} over this bullet's two comparisons).",
    ]


FINDINGS = flat((ROOT / "docs" / "findings.md").read_text())


@pytest.mark.parametrize(
    "claims",
    [
        table2_claims,
        figure10_claims,
        figure4_claims,
        table_claims,
        miniature_claims,
    ],
    ids=[
        "table2_regime",
        "fig10_regime",
        "fig4_regime",
        "tables",
        "miniature",
    ],
)
def test_the_prose_states_what_the_committed_runs_give(claims):
    # Computed here, not at collection: only the worker that runs the test loads the runs.
    assert [claim for claim in claims() if flat(claim) not in FINDINGS] == []
