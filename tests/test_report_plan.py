"""The analysis a sweep commits to (`analysis:` in its config, `lit-asyncrl report --plan`): its
endpoint, its families of comparisons and the paired test, on hand-written runs with hand-computed
statistics."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lit_asyncrl.config_dir import config_dir
from lit_asyncrl.report.analysis_plan import Endpoint, load_plan
from lit_asyncrl.report.comparisons import paired
from lit_asyncrl.report.main import main as report_main
from lit_asyncrl.report.runs import load_run
from tests.support.report_runs import table_rows, write_run

PLAN = """
analysis:
  endpoint_evaluations: 3
  families:
    exact:
      - [snapshot, interrupt_sync]
    proxies:
      - [snapshot, ppo_ewma]
      - [interrupt_sync, ppo_ewma]
"""


def evaluated_run(root: Path, experiment: str, seed: int, scores: list[float]) -> Path:
    """A finished run whose held-out avg@4 takes `scores` in turn, the first before any RL step."""
    rows = [{"step": 20 * index, "val/avg@4": score} for index, score in enumerate(scores)]
    overrides = [f"experiment={experiment}", f"seed={seed}"]
    return write_run(root / f"experiment={experiment},seed={seed}", overrides, rows)


def test_the_endpoint_averages_the_last_evaluations_after_the_start(tmp_path):
    run = load_run(evaluated_run(tmp_path, "snapshot", 0, [0.4, 0.5, 0.6, 0.7, 0.9]))
    assert Endpoint(3).score(run, "val/avg@4") == pytest.approx((0.6 + 0.7 + 0.9) / 3)
    assert Endpoint(1).score(run, "val/avg@4") == 0.9
    # Four evaluations after the start: all four; five asked for: not scored (the start is not an end).
    assert Endpoint(4).score(run, "val/avg@4") == pytest.approx(0.675)
    assert Endpoint(5).score(run, "val/avg@4") is None


def test_the_paired_test_matches_the_hand_computed_statistic():
    # Differences 0.1, 0.05, 0.1 on seeds 0-2 (seed 3 only on one side, left out): mean 0.08333,
    # sample sd sqrt((2 * 0.016667^2 + 0.033333^2) / 2) = 0.028868, se 0.016667, t = 5.0; df 2,
    # t(2, 0.975) = 4.303 (tables): interval 0.08333 -+ 0.07172; two-sided p for t = 5, df 2 is
    # 1 - 5 / sqrt(27) = 0.0377 (the t distribution with 2 degrees of freedom has a closed form).
    difference, low, high, t, p = paired({0: 0.6, 1: 0.7, 2: 0.65, 3: 0.9}, {0: 0.5, 1: 0.65, 2: 0.55})
    assert difference == pytest.approx(0.083333, abs=1e-6) and t == pytest.approx(5.0)
    assert (low, high) == (pytest.approx(0.01161, abs=1e-4), pytest.approx(0.15506, abs=1e-4))
    assert p == pytest.approx(1 - 5 / 27**0.5, abs=1e-6)
    assert paired({0: 0.6, 1: 0.7}, {1: 0.5, 2: 0.4}) is None  # one shared seed: no test


@pytest.fixture
def planned_sweep(tmp_path: Path) -> tuple[Path, Path]:
    sweep = tmp_path / "sweep"
    # snapshot's endpoints: (0.6+0.6+0.6)/3 = 0.6, 0.62, 0.64 over seeds 0-2 (the last evaluation
    # alone would give 0.9, 0.62, 0.64: the endpoint is not the last value)
    evaluated_run(sweep, "snapshot", 0, [0.4, 0.1, 0.3, 0.3, 0.6, 0.9])
    evaluated_run(sweep, "snapshot", 1, [0.4, 0.1, 0.3, 0.62, 0.62, 0.62])
    evaluated_run(sweep, "snapshot", 2, [0.4, 0.1, 0.3, 0.64, 0.64, 0.64])
    for seed, end in enumerate([0.5, 0.55, 0.57]):
        evaluated_run(sweep, "interrupt_sync", seed, [0.4, 0.4, end, end, end])
    for seed, end in enumerate([0.3, 0.35]):
        evaluated_run(sweep, "ppo_ewma", seed, [0.4, 0.4, end, end, end])
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    return sweep, plan


def test_a_planned_report_scores_the_endpoint_and_adjusts_each_family_on_its_own(planned_sweep, tmp_path):
    sweep, plan = planned_sweep
    out = tmp_path / "report"
    assert report_main([str(sweep), "--out", str(out), "--plan", str(plan)]) == 0
    report = (out / "report.md").read_text()
    assert f"Analysis committed with the sweep ({plan}): the endpoint is the mean of the last 3" in report
    header, *rows = table_rows(report, "Held out, per seed")
    assert header[1] == "seed 0: avg@4 start -> mean of last 3"
    assert {row[0]: row[1:] for row in rows}["snapshot"] == [
        "0.400 -> 0.600",
        "0.400 -> 0.620",
        "0.400 -> 0.640",
        "+0.220",
    ]
    header, *exact = table_rows(report, "Comparisons (exact)")
    assert header[3] == "avg@4 mean of last 3, A - B [95% interval]"
    # snapshot 0.60, 0.62, 0.64 against 0.50, 0.55, 0.57: Welch +0.08; paired, differences 0.10, 0.07,
    # 0.07 (mean 0.08, sd 0.01732, se 0.01, t = 8.0)
    (row,) = exact
    assert row[:4] == ["snapshot", "interrupt_sync", "3, 3", row[3]] and row[3].startswith("+0.080 [")
    assert row[5] == row[4].split(", ")[1]  # one test alone: Holm leaves it as it is
    assert row[9].startswith("+0.080 [") and row[10].startswith("8.00, ")
    _, *proxies = table_rows(report, "Comparisons (proxies)")
    assert [row[:3] for row in proxies] == [["snapshot", "ppo_ewma", "3, 2"], ["interrupt_sync", "ppo_ewma", "3, 2"]]
    raw = sorted(float(row[4].split(", ")[1]) for row in proxies)
    assert sorted(float(row[5]) for row in proxies) == pytest.approx(
        [min(1, 2 * raw[0]), max(2 * raw[0], raw[1])], abs=2e-3
    )
    assert "over this table's 2 comparisons" in report and "over this table's 1 comparisons" in report


@pytest.mark.parametrize(
    ("plan_text", "message"),
    [
        ("seed: 0\n", "has no `analysis:` block"),
        ("analysis:\n  endpoint_evaluations: 0\n  families: {a: [[x, y]]}\n", "analysis.endpoint_evaluations must be"),
        ("analysis:\n  families: {a: [x, y]}\n", "analysis.families.a must be a list of [A, B] pairs"),
        ("analysis:\n  endpoint_evaluations: 2\n", "analysis.families must map"),
        (PLAN.replace("interrupt_sync]", "interupt_sync]", 1), "no configuration 'interupt_sync'"),
    ],
)
def test_a_wrong_plan_is_refused_naming_its_key_before_any_output(planned_sweep, tmp_path, plan_text, message):
    sweep, plan = planned_sweep
    plan.write_text(plan_text)
    with pytest.raises(SystemExit, match=re.escape(message)):
        report_main([str(sweep), "--out", str(tmp_path / "report"), "--plan", str(plan)])
    assert not (tmp_path / "report").exists()


def test_a_plan_leaves_no_room_for_comparisons_chosen_afterwards(planned_sweep, tmp_path, capsys):
    sweep, plan = planned_sweep
    with pytest.raises(SystemExit):
        report_main([str(sweep), "--out", str(tmp_path / "report"), "--plan", str(plan), "--all-pairs"])
    assert "--plan states the comparisons" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=re.escape("--plan table2_decisiv: neither a file nor a sweep")):
        report_main([str(sweep), "--out", str(tmp_path / "report"), "--plan", "table2_decisiv"])


def test_the_table2_rerun_plan_compares_every_pair_of_its_arms_once():
    plan = load_plan("table2_decisive")
    arms = OmegaConf.load(Path(config_dir()) / "sweep" / "table2_decisive.yaml").hydra.sweeper.params.experiment
    arms = arms.split(",")
    assert plan.endpoint == Endpoint(3) and list(plan.families) == ["table2_decisive"]
    assert plan.source == "conf/sweep/table2_decisive.yaml"  # as the repository names it, not this checkout's path
    pairs = plan.families["table2_decisive"]
    assert sorted(map(frozenset, pairs), key=sorted) == sorted(
        map(frozenset, itertools.combinations(arms, 2)), key=sorted
    )
    assert len(pairs) == len(set(map(frozenset, pairs))) == 10
