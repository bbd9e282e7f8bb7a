"""The report's per-seed scores and Welch comparisons, on hand-written runs with hand-computed
statistics."""

from __future__ import annotations

import gc
import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_asyncrl.report.comparisons import holm_adjusted, welch
from lit_asyncrl.report.main import main as report_main
from tests.support.report_runs import table_rows, write_run


def held_out_runs(root: Path, experiment: str, scores: list[tuple[float, float]]) -> None:
    """One finished run per seed, held-out avg@4 at start and end as given."""
    for seed, (start, end) in enumerate(scores):
        rows = [
            {"step": 0, "val/avg@4": start, "train/task_success": 0.0},
            {"step": 5, "val/avg@4": end, "train/task_success": 0.1},
        ]
        write_run(root / f"experiment={experiment},seed={seed}", [f"experiment={experiment}", f"seed={seed}"], rows)


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    """Three configurations: snapshot (3 seeds), linear_prox (3 seeds), ppo_ewma (2 seeds)."""
    sweep = tmp_path / "sweep"
    held_out_runs(sweep, "snapshot", [(0.40, 0.60), (0.40, 0.62), (0.40, 0.61)])
    held_out_runs(sweep, "linear_prox", [(0.40, 0.40), (0.42, 0.41), (0.38, 0.42)])
    held_out_runs(sweep, "ppo_ewma", [(0.40, 0.5), (0.40, 0.7)])
    return sweep


def test_welch_matches_the_hand_computed_statistic_and_textbook_interval():
    # A: mean 0.61, sample variance 1e-4; B: mean 0.41, same. se = sqrt(1e-4/3 + 1e-4/3) = 8.165e-3,
    # t = 0.2 / se = 24.49; equal variances and sizes: df = 4, t(4, 0.975) = 2.776 (tables), so the
    # interval is 0.2 -+ 2.776 * 8.165e-3 = [0.1773, 0.2227].
    difference, low, high, t, p = welch([0.60, 0.62, 0.61], [0.40, 0.41, 0.42])
    assert difference == pytest.approx(0.2)
    assert t == pytest.approx(24.49, abs=0.01)
    assert (low, high) == (pytest.approx(0.1773, abs=2e-4), pytest.approx(0.2227, abs=2e-4))
    assert p < 1e-4
    # unequal sizes and variances: A 0.5, 0.7 (var 0.02), B 0.2, 0.3, 0.4 (var 0.01):
    # se^2 = 0.02/2 + 0.01/3 = 0.013333, t = 0.3 / 0.11547 = 2.598; df = 0.013333^2 / (0.01^2/1 +
    # 0.003333^2/2) = 1.684, under 2: p is above 0.1 (t(2, 0.95) = 2.92 > 2.598 already)
    difference, low, high, t, p = welch([0.5, 0.7], [0.2, 0.3, 0.4])
    assert (difference, t) == (pytest.approx(0.3), pytest.approx(2.598, abs=1e-3))
    assert 0.1 < p < 0.5 and low < 0 < high
    assert math.isclose((low + high) / 2, difference)


def test_the_report_lists_each_seed_and_compares_the_pairs_asked_for(sweep, tmp_path):
    out = tmp_path / "report"
    assert (
        report_main([str(sweep), "--out", str(out), "--baseline", "snapshot", "--compare", "ppo_ewma", "linear_prox"])
        == 0
    )
    report = (out / "report.md").read_text()
    header, *rows = table_rows(report, "Held out, per seed")
    assert header == [
        "configuration",
        "seed 0: avg@4 start -> end",
        "seed 1: avg@4 start -> end",
        "seed 2: avg@4 start -> end",
        "mean change",
    ]
    per_seed = {row[0]: row[1:] for row in rows}
    assert per_seed["snapshot"] == ["0.400 -> 0.600", "0.400 -> 0.620", "0.400 -> 0.610", "+0.210"]
    assert per_seed["ppo_ewma"] == ["0.400 -> 0.500", "0.400 -> 0.700", "–", "+0.200"]
    _, *rows = table_rows(report, "Comparisons")
    compared = {(row[0], row[1]): row[2:] for row in rows}
    assert list(compared) == [("ppo_ewma", "linear_prox"), ("linear_prox", "snapshot"), ("ppo_ewma", "snapshot")]
    # linear_prox - snapshot at the end: the first case of the test above, negated: -0.2 [-0.223, -0.177]
    seeds, end, end_test, end_holm, change, _, _, paired_end, paired_test, _, verdict = compared[
        ("linear_prox", "snapshot")
    ]
    assert seeds == "3, 3" and end == "-0.200 [-0.223, -0.177]" and end_test.startswith("-24.49, 0.000")
    assert end_holm == "0.000" and verdict == "B higher (Holm p < 0.05)"
    # paired by seed: differences -0.20, -0.21, -0.19 (mean -0.2, sd 0.01, se 0.005774, t = -34.64)
    assert paired_end.startswith("-0.200 [") and paired_test.startswith("-34.64, ")
    # change: linear 0.00, -0.01, +0.04 (mean 0.01) against 0.20, 0.22, 0.21 (mean 0.21)
    assert change.startswith("-0.200 [")
    # ppo_ewma (0.5, 0.7) - linear_prox (0.40, 0.41, 0.42) at the end: 0.6 - 0.41 = 0.19, 2 and 3 seeds
    assert compared[("ppo_ewma", "linear_prox")][1].startswith("+0.190 [")
    assert compared[("ppo_ewma", "linear_prox")][-1] == "not separable with 2 and 3 seeds"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--baseline", "snapshots"], "no configuration 'snapshots'; the runs hold: 'ppo_ewma', 'snapshot'"),
        (
            ["--compare", "snapshot", "ppo_ewma"],
            "'ppo_ewma' has 1 run(s) with held-out scores; a test needs two or more",
        ),
    ],
)
def test_a_comparison_the_runs_cannot_make_is_refused_before_any_figure(tmp_path, arguments, message):
    sweep = tmp_path / "sweep"
    held_out_runs(sweep, "snapshot", [(0.4, 0.6), (0.4, 0.62)])
    held_out_runs(sweep, "ppo_ewma", [(0.4, 0.5)])
    with pytest.raises(SystemExit, match=re.escape(message)):
        report_main([str(sweep), "--out", str(tmp_path / "report"), *arguments])
    assert not (tmp_path / "report").exists()


def test_holm_multiplies_the_ordered_p_values_by_the_tests_left_and_keeps_their_order():
    # Sorted 0.01, 0.03, 0.04: times 3, 2, 1 = 0.03, 0.06, 0.04; never below an earlier one: 0.03, 0.06, 0.06.
    assert holm_adjusted([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # Capped at 1; one test alone is left as it is.
    assert holm_adjusted([0.6, 0.001]) == pytest.approx([0.6, 0.002])
    assert holm_adjusted([0.044]) == pytest.approx([0.044])
    # Tied p-values get the same adjusted value; a missing one (NaN) stays missing and is ordered last.
    assert holm_adjusted([0.02, 0.02, 0.5]) == pytest.approx([0.06, 0.06, 0.5])
    assert holm_adjusted([0.01, math.nan, 0.03]) == pytest.approx([0.03, math.nan, 0.06], nan_ok=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=1, max_size=12))
def test_holm_gives_statsmodels_values_for_any_family(p_values):
    from statsmodels.stats.multitest import multipletests

    # statsmodels collects garbage on every call (why the report does not use it): with this process's
    # objects frozen that walks nothing, instead of 0.1-0.4 s per example.
    gc.freeze()
    try:
        expected = multipletests(p_values, method="holm")[1]
    finally:
        gc.unfreeze()
    assert holm_adjusted(p_values) == pytest.approx(list(expected), abs=1e-15)


def test_all_pairs_compares_every_pair_once_as_one_holm_family(sweep, tmp_path):
    out = tmp_path / "report"
    # A pair asked for by --compare as well is not tested twice.
    assert report_main([str(sweep), "--out", str(out), "--compare", "snapshot", "linear_prox", "--all-pairs"]) == 0
    _, *rows = table_rows((out / "report.md").read_text(), "Comparisons")
    assert sorted(tuple(sorted(row[:2])) for row in rows) == [
        ("linear_prox", "ppo_ewma"),
        ("linear_prox", "snapshot"),
        ("ppo_ewma", "snapshot"),
    ]
    # Three tests: sorted by raw p they are multiplied by 3, 2 and 1, each never below the one before.
    raw = [float(row[4].split(", ")[1]) for row in rows]
    order = sorted(range(3), key=lambda index: raw[index])
    expected, floor = [0.0] * 3, 0.0
    for rank, index in enumerate(order):
        floor = max(floor, min(1.0, (3 - rank) * raw[index]))
        expected[index] = floor
    assert [float(row[5]) for row in rows] == pytest.approx(expected, abs=3e-3)
    assert max(raw) > 0.1  # a family with a large p, so the multipliers show
    assert "over this table's 3 comparisons" in (out / "report.md").read_text()
