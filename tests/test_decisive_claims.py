"""The numbers docs/findings.md and the README state about the rerun of Table 2's decisive arms,
recomputed from its committed runs by the analysis its sweep committed before the first run
(`analysis:` in conf/sweep/table2_decisive.yaml); a sentence whose number drifts from its data fails."""

from __future__ import annotations

import functools
import statistics

import pytest
from omegaconf import OmegaConf
from scipy import stats

from lit_asyncrl.report.comparisons import holm_adjusted
from lit_asyncrl.report.runs import Run
from tests.support.committed_runs import ROOT, SCORE, compare_paired, flat, groups, regime


def decisive_regime_claims() -> list[str]:
    """The regime each arm of the Table 2 rerun measured in its own runs."""
    labelled = groups("table2_decisive")
    exact = [regime(run) for label in ("snapshot", "interrupt_sync") for run in labelled[label]]
    ewma = [regime(run) for label in ("ppo_ewma", "ppo_ewma_beta075") for run in labelled[label]]
    recompute = [regime(run) for run in labelled["decoupled_async"]]
    return [
        f"one version moved the policy by {min(exact):.2f} to {max(exact):.2f} times the discrepancy in the exact "
        f"routes' {len(exact)} runs, {min(ewma):.2f} to {max(ewma):.2f} times in the EWMA's {len(ewma)} and "
        f"{min(recompute):.2f} to {max(recompute):.2f} times under async recompute ({len(recompute)} runs)",
        f"the exact routes' drift there is about the discrepancy ({min(exact):.1f} to {max(exact):.1f} times)",
    ]


def plan_endpoint(run: Run) -> float:
    """The Table 2 rerun's primary endpoint, as its sweep committed it before the first run: the mean of
    the last 3 held-out evaluations after the start."""
    return statistics.fmean(run.values(SCORE)[1:][-3:])


@functools.cache
def decisive_family() -> dict[tuple[str, str], tuple[float, float, float, float, float]]:
    """The Table 2 rerun's committed family, each pair as the sweep's `analysis:` orders it: {(A, B): (A - B
    in the endpoint's means, Welch p, Holm p over the family, A - B paired by seed, paired Holm p)}."""
    plan = OmegaConf.load(ROOT / "conf" / "sweep" / "table2_decisive.yaml").analysis
    pairs = [(first, second) for first, second in plan.families.table2_decisive]
    labelled = groups("table2_decisive")
    welch, paired = [], []
    for first, second in pairs:
        by_seed = [{run.seed: plan_endpoint(run) for run in labelled[label]} for label in (first, second)]
        values = [list(side.values()) for side in by_seed]
        welch.append(
            (
                statistics.fmean(values[0]) - statistics.fmean(values[1]),
                float(stats.ttest_ind(*values, equal_var=False).pvalue),
            )
        )
        seeds = sorted(by_seed[0].keys() & by_seed[1].keys())
        matched = [[side[seed] for seed in seeds] for side in by_seed]
        paired.append(
            (
                statistics.fmean(a - b for a, b in zip(*matched)),
                float(stats.ttest_rel(*matched).pvalue),
            )
        )
    welch_holm = holm_adjusted([p for _, p in welch])
    paired_holm = holm_adjusted([p for _, p in paired])
    return {
        pair: (difference, p, holm, paired_difference, paired_adjusted)
        for pair, (difference, p), holm, (paired_difference, _), paired_adjusted in zip(
            pairs, welch, welch_holm, paired, paired_holm
        )
    }


def decisive_row(runs: list[Run]) -> str:
    """An arm's row in the Table 2 rerun's table: held-out start -> the plan's endpoint (mean ± sd over
    seeds), the mean change, the seeds that rose, the range over runs of the mean version gap and of the
    regime, and the mean over seeds of each run's lowest mask."""
    starts, ends = [run.values(SCORE)[0] for run in runs], [plan_endpoint(run) for run in runs]
    changes = [finish - start for start, finish in zip(starts, ends)]
    gaps = [statistics.fmean(run.values("train/version_gap_mean")) for run in runs]
    regimes = [regime(run) for run in runs]
    lowest_mask = statistics.fmean(min(run.values("train/train_infer_mask")) for run in runs)
    cells = [
        f"{statistics.fmean(starts):.3f} -> {statistics.fmean(ends):.3f} ± {statistics.stdev(ends):.3f}",
        f"{statistics.fmean(changes):+.3f}",
        f"{sum(change > 0 for change in changes)} of {len(runs)}",
        f"{min(gaps):.2f}-{max(gaps):.2f}",
        f"{min(regimes):.2f}-{max(regimes):.2f}",
        f"{lowest_mask:.3f}",
    ]
    return " | ".join(cells)


#: How the Table 2 rerun's prose names its arms.
DECISIVE_ARMS = {
    "snapshot": "snapshot",
    "interrupt_sync": "interrupt-sync",
    "ppo_ewma": "EWMA W/(W+2)",
    "ppo_ewma_beta075": "EWMA 0.75",
    "decoupled_async": "async recompute",
}


def decisive_claims() -> list[str]:
    """The Table 2 rerun's table, the comparisons of its committed family sorted by their verdict, and what
    the prose reads from them."""
    labelled = groups("table2_decisive")
    family = decisive_family()
    held = [pair for pair, values in family.items() if values[2] < 0.05]
    paired_only = [pair for pair, values in family.items() if values[2] >= 0.05 and values[4] < 0.05]
    (seeds,) = {len(runs) for runs in labelled.values()}

    def welch(pair: tuple[str, str]) -> str:
        difference, p, holm = family[pair][:3]
        return f"{DECISIVE_ARMS[pair[0]]} against {DECISIVE_ARMS[pair[1]]} {difference:+.3f} (p = {p:.3f}, Holm {holm:.3f})"

    def paired(pair: tuple[str, str]) -> str:
        difference, holm = family[pair][3:]
        return f"{DECISIVE_ARMS[pair[0]]} against {DECISIVE_ARMS[pair[1]]} {difference:+.3f} (paired Holm {holm:.3f})"

    def changes(label: str) -> list[float]:
        return [plan_endpoint(run) - run.values(SCORE)[0] for run in labelled[label]]

    def fell(label: str) -> str:
        rose = sum(change > 0 for change in changes(label))
        return f"{statistics.fmean(changes(label)):+.3f} ({rose} of {len(changes(label))} rose)"

    all_changes = [statistics.fmean(changes(label)) for label in labelled]
    minutes = [run.summary["wall_s"] / 60 for runs in labelled.values() for run in runs]
    decay_against_snapshot = family[("snapshot", "ppo_ewma_beta075")][0]
    decay_against_interrupt = family[("interrupt_sync", "ppo_ewma_beta075")][0]
    before = compare_paired("table2_regime", "interrupt_sync", "ppo_ewma_beta075")[1]
    after = family[("interrupt_sync", "ppo_ewma_beta075")][4]
    return [
        *(f"| {DECISIVE_ARMS[label]} | {decisive_row(runs)} |" for label, runs in labelled.items()),
        f"**Held** (Holm p < 0.05 over the family's {len(family)} pairs, {seeds} seeds each): "
        + "; ".join(map(welch, held))
        + ".",
        f"**Not separable with {seeds} seeds**: " + "; ".join(welch(pair) for pair in family if pair not in held) + ".",
        "Paired by seed, separated where Welch's test did not separate: " + "; ".join(map(paired, paired_only)) + ".",
        f"EWMA 0.75's mean ended {-decay_against_snapshot:.3f} {'above' if decay_against_snapshot < 0 else 'below'} "
        f"snapshot's and {decay_against_interrupt:.3f} {'below' if decay_against_interrupt > 0 else 'above'} "
        "interrupt-sync's",
        f"(paired Holm {before:.3f} with 5 seeds) did not hold here (paired Holm {after:.3f})",
        f"Every arm's mean change from its start to the endpoint was {'negative' if max(all_changes) < 0 else 'not'}: "
        f"snapshot {fell('snapshot')}, interrupt-sync {fell('interrupt_sync')}, EWMA 0.75 {fell('ppo_ewma_beta075')}, "
        f"EWMA W/(W+2) {fell('ppo_ewma')}, async recompute {fell('decoupled_async')}.",
        f"{len(minutes)} runs of {min(minutes):.1f} to {max(minutes):.1f} minutes, {sum(minutes):.0f} minutes of runs in all",
    ]


@pytest.mark.parametrize("claims", [decisive_regime_claims, decisive_claims], ids=["regime", "comparisons"])
def test_the_prose_states_what_the_reruns_committed_runs_give(claims):
    findings = flat((ROOT / "docs" / "findings.md").read_text())
    assert [claim for claim in claims() if flat(claim) not in findings] == []


def test_the_readmes_findings_sentence_holds_for_the_committed_runs():
    family = decisive_family()
    exact, decays = ("snapshot", "interrupt_sync"), ("ppo_ewma", "ppo_ewma_beta075")
    separated = {pair for pair, values in family.items() if values[2] < 0.05}
    assert separated == {(arm, "decoupled_async") for arm in (*exact, *decays)}
    assert all(family[pair][0] > 0 for pair in separated)  # async recompute below each
    (seeds,) = {len(runs) for runs in groups("table2_decisive").values()}
    claim = (
        f"({seeds} seeds, analysis committed before the runs), async recompute ended below both exact routes and "
        f"both EWMA decays (Holm over {len(family)} pairs), and neither EWMA decay was separable from the exact routes"
    )
    assert flat(claim) in flat((ROOT / "README.md").read_text())
