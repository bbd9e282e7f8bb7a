"""`lit-asyncrl report` over hand-written run directories: grouping by configuration, mean and spread
over seeds, figures written; and the resumable sweep's skip of finished jobs."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from lit_asyncrl.cli import main as cli_main
from lit_asyncrl.report.aggregate import seed_band, smooth
from lit_asyncrl.report.main import main as report_main
from lit_asyncrl.report.runs import group_by_label, load_run, run_label
from lit_asyncrl.report.table import results_table
from lit_asyncrl.run_summary import is_finished, read_summary, write_summary
from tests.support.report_runs import table_rows, write_run


def training_rows(success: list[float], mask: list[float], fidelity_gap1: float, step_s: float) -> list[dict]:
    rows = []
    for step, (value, kept) in enumerate(zip(success, mask, strict=True)):
        rows.append(
            {
                "step": step,
                "train/task_success": value,
                "train/train_infer_mask": kept,
                "train/step_s": step_s,
                "train/ref_behavior_logratio_absmean": 0.001 * (step + 1),
                "train/version_gap_mean": float(step + 1),
            }
        )
        rows.append({"step": step, "fidelity/logratio_absmean/gap_1": fidelity_gap1})
    return rows


@pytest.fixture
def sweep(tmp_path) -> Path:
    root = tmp_path / "table2"
    # snapshot, two seeds: held-out avg@4 ends at 0.5 and 0.7; lowest masks 0.9 and 0.8
    for seed, success, mask, step_s, end_avg, end_pass, wall_s in (
        (0, [0.1, 0.3], [0.95, 0.9], 1.0, 0.5, 0.9, 60.0),
        (1, [0.2, 0.4], [0.8, 0.85], 3.0, 0.7, 1.0, 180.0),
    ):
        held_out = [
            {"step": 0, "val/avg@4": 0.4, "val/pass@4": 0.8},
            {"step": 1, "val/avg@4": end_avg, "val/pass@4": end_pass},
        ]
        rows = [*training_rows(success, mask, 0.0, step_s), *held_out]
        write_run(
            root / f"experiment=snapshot,seed={seed}", ["experiment=snapshot", f"seed={seed}"], rows, wall_s=wall_s
        )
    # EWMA, one seed that did not finish
    write_run(
        root / "experiment=ppo_ewma,reference.beta=0.9,seed=0",
        ["experiment=ppo_ewma", "reference.beta=0.9", "seed=0"],
        [
            *training_rows([0.0, 0.2], [1.0, 0.5], 0.02, 2.0),
            {"step": 1, "reference/ewma_resets": 2.0, "reference/ewma_beta": 0.6},
            {"step": 1, "val/avg@4": 0.25, "val/pass@4": 0.5},
        ],
        finished=False,
    )
    return root


def test_labels_drop_the_seed_and_launch_keys():
    assert run_label(["+sweep=table2", "experiment=snapshot", "seed=2", "skip_finished=true"]) == "snapshot"
    assert run_label(["experiment=ppo_ewma", "reference.beta=0.9", "seed=0"]) == "ppo_ewma reference.beta=0.9"
    assert run_label(["seed=3"]) == "default"


def test_runs_group_by_configuration_with_their_seeds(sweep):
    runs = [load_run(path) for path in sorted(sweep.iterdir())]
    groups = group_by_label(runs)
    assert {label: [run.seed for run in members] for label, members in groups.items()} == {
        "ppo_ewma reference.beta=0.9": [0],
        "snapshot": [0, 1],
    }
    assert groups["ppo_ewma reference.beta=0.9"][0].summary is None  # unfinished: read from .hydra


def test_seed_band_is_mean_min_max_at_common_steps(sweep):
    runs = group_by_label([load_run(path) for path in sorted(sweep.iterdir())])["snapshot"]
    steps, mean, low, high = seed_band(runs, "train/task_success")
    assert steps == [0, 1]
    assert (
        mean == pytest.approx([0.15, 0.35]) and low == pytest.approx([0.1, 0.3]) and high == pytest.approx([0.2, 0.4])
    )
    assert smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_report_command_writes_the_table_and_figures(sweep, tmp_path):
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["report", *map(str, sorted(sweep.iterdir())), "--out", str(out), "--smooth", "1"])
    assert exit_info.value.code == 0
    assert (out / "curves.png").stat().st_size > 10_000 and (out / "fidelity.png").stat().st_size > 5_000
    header, *body = table_rows((out / "report.md").read_text())
    table = {row[0]: dict(zip(header, row, strict=True)) for row in body}
    snapshot = table["snapshot"]
    # avg@4 at the end: 0.5 and 0.7 -> mean 0.6, sample sd 0.1414; pass@4: 0.9 and 1.0
    assert snapshot["held-out avg@4 at end"] == "0.600 ± 0.141"
    assert snapshot["held-out avg@4 at start"] == "0.400"  # 0.4 in both seeds: no spread
    assert snapshot["held-out pass@4 at end"] == "0.950 ± 0.071"
    # lowest masks 0.9 and 0.8; median step 1.0 and 3.0 s; wall 1 and 3 minutes
    assert snapshot["lowest train-infer mask"] == "0.850 ± 0.071"
    assert snapshot["step s (median)"] == "2.00 ± 1.41"
    assert snapshot["wall min"] == "2.0 ± 1.4"
    assert snapshot["seeds (finished)"] == "2 (2)"
    assert snapshot["EWMA resets"] == "–" and snapshot["EWMA beta (end)"] == "–"
    assert snapshot["version gap (mean)"] == "1.50"  # steps at gap 1 and 2, the same in both seeds
    assert snapshot["mean abs log(pi_ref/mu)"] == "1.5e-03"  # steps 0.001 and 0.002, the same in both seeds
    assert snapshot["fidelity gap 1"] == "0.0e+00"
    ewma = table["ppo_ewma reference.beta=0.9"]
    assert ewma["seeds (finished)"] == "1 (0)" and ewma["EWMA resets"] == "2.0" and ewma["EWMA beta (end)"] == "0.60"
    assert ewma["fidelity gap 1"] == "2.0e-02" and ewma["fidelity gap 0"] == "–"
    assert ewma["held-out avg@4 at end"] == "0.250" and ewma["wall min"] == "–"


def test_a_sweep_directory_stands_for_its_runs_and_the_commands_are_stated(sweep, tmp_path):
    out = tmp_path / "report"
    with pytest.raises(SystemExit):
        cli_main(
            ["report", str(sweep), "--out", str(out), "--runs-command", "python -m lit_asyncrl.train -m +sweep=table2"]
        )
    text = (out / "report.md").read_text()
    assert "3 runs in 2 configurations" in text
    # the finished runs took 60 s and 180 s
    assert "Runs: `python -m lit_asyncrl.train -m +sweep=table2`, 4 minutes of runs in all" in text
    assert f"Report: `lit-asyncrl report {sweep} --out {out}" in text


def test_report_refuses_paths_without_runs(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no run directories"):
        cli_main(["report", str(tmp_path / "empty"), "--out", str(tmp_path / "out")])


def test_a_shell_glob_over_a_sweep_passes_over_its_other_files(sweep, tmp_path):
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    (sweep / "report").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["report", *map(str, sorted(sweep.iterdir())), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 0 and "3 runs in 2 configurations" in (tmp_path / "out" / "report.md").read_text()


def test_runs_of_two_sweeps_with_the_same_configuration_and_seed_are_refused(sweep, tmp_path):
    other = tmp_path / "quick"
    write_run(
        other / "experiment=snapshot,seed=0",
        ["+sweep=findings_quick", "experiment=snapshot", "seed=0"],
        training_rows([0.5], [1.0], 0.0, 1.0),
    )
    with pytest.raises(SystemExit, match="share a seed"):
        cli_main(["report", str(sweep), str(other), "--out", str(tmp_path / "out")])


def test_a_seed_cut_short_leaves_its_later_steps_to_the_others_and_the_table_to_finished_runs(tmp_path):
    write_run(tmp_path / "s0", ["seed=0"], training_rows([0.2, 0.4, 0.6], [1.0, 1.0, 0.7], 0.0, 1.0))
    write_run(tmp_path / "s1", ["seed=1"], training_rows([0.0, math.nan], [0.5, 0.5], 0.0, 1.0), finished=False)
    runs = group_by_label([load_run(tmp_path / "s0"), load_run(tmp_path / "s1")])["default"]
    steps, mean, low, high = seed_band(runs, "train/task_success")
    # step 0: both seeds; step 1: seed 1's NaN says nothing; step 2: seed 0 alone
    assert steps == [0, 1, 2] and mean == pytest.approx([0.1, 0.4, 0.6]) and low == pytest.approx([0.0, 0.4, 0.6])
    table = results_table({"default": runs})
    row = dict(
        zip(*[line.strip("| ").split(" | ") for line in table.splitlines() if not line.startswith("|---")], strict=True)
    )
    assert row["seeds (finished)"] == "2 (1)"
    assert row["lowest train-infer mask"] == "0.700"  # the finished seed's, not the killed one's 0.5


def test_summary_round_trip_and_finished_flag(tmp_path):
    assert not is_finished(tmp_path)
    (tmp_path / "summary.json.partial").write_text("{")  # a run killed while writing its summary
    assert not is_finished(tmp_path)
    write_summary(tmp_path, ["seed=1"], 12.5, {"val/avg@4": 0.25}, fingerprint="abc")
    assert is_finished(tmp_path, "abc") and not is_finished(tmp_path, "edited-config")
    summary = read_summary(tmp_path)
    assert is_finished(tmp_path) and summary["wall_s"] == 12.5 and summary["overrides"] == ["seed=1"]
    assert (
        summary["final_metrics"] == {"val/avg@4": 0.25}
        and "CPUs" in summary["machine"]
        and summary["config_fingerprint"] == "abc"
    )
    assert json.loads((tmp_path / "summary.json").read_text()) == summary


def test_a_finished_job_is_skipped_when_the_sweep_is_launched_again(tmp_path):
    run_dir = tmp_path / "job"
    run_dir.mkdir()
    write_summary(run_dir, ["experiment=snapshot"], 1.0, {"train/task_success": 0.75})
    result = subprocess.run(
        [sys.executable, "-m", "lit_asyncrl.train", "skip_finished=true", f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"skipped (finished before with this config): {run_dir}" in result.stdout
    assert not (run_dir / "metrics.csv").exists()  # nothing ran


def test_legend_columns_fit_the_longest_label():
    from lit_asyncrl.report.figures import legend_columns

    assert legend_columns(["snapshot", "ppo_ewma", "dedicated", "interrupt_sync"]) == 3
    assert legend_columns(["a" * 80, "b"]) == 2  # 170 // 80
    # four labels of 90 characters (the fig3 sweep's): one per row, none cut at the edges
    assert legend_columns(["x" * 90] * 4) == 1
    assert legend_columns([]) == 1


def test_runs_on_a_mixture_get_a_table_per_task(tmp_path):
    from lit_asyncrl.report.table import per_task_table

    for seed, desk_end, guess_end in ((0, 0.5, 1.0), (1, 0.7, 0.5)):
        held_out = [
            {
                "step": 0,
                "val/avg@4": 0.4,
                "val/desk/avg@4": 0.3,
                "val/desk/pass@4": 0.6,
                "val/guess/avg@4": 0.5,
                "val/guess/pass@4": 1.0,
            },
            {
                "step": 5,
                "val/avg@4": 0.6,
                "val/desk/avg@4": desk_end,
                "val/desk/pass@4": 0.9,
                "val/guess/avg@4": guess_end,
                "val/guess/pass@4": 1.0,
            },
        ]
        write_run(
            tmp_path / f"seed={seed}",
            ["experiment=task_mix", f"seed={seed}"],
            [*training_rows([0.1], [1.0], 0.0, 1.0), *held_out],
        )
    groups = group_by_label([load_run(path) for path in sorted(tmp_path.iterdir())])
    table = per_task_table(groups).splitlines()
    assert (
        table[0]
        == "| configuration | desk avg@4 start -> end | desk pass@4 end | guess avg@4 start -> end | guess pass@4 end |"
    )
    # desk: 0.3 at the start in both seeds, 0.5 and 0.7 at the end: 0.6 ± 0.141; guess ends at 1.0 and 0.5: 0.75 ± 0.354
    assert table[2] == "| task_mix | 0.300 -> 0.600 ± 0.141 | 0.900 | 0.500 -> 0.750 ± 0.354 | 1.000 |"
    # A run on one task has no such table.
    assert (
        per_task_table(
            {"snapshot": [load_run(write_run(tmp_path / "single", ["seed=0"], training_rows([0.1], [1.0], 0.0, 1.0)))]}
        )
        is None
    )


def test_runs_on_a_tool_task_get_a_table_of_calls_and_failed_calls(tmp_path):
    from lit_asyncrl.report.table import tool_calls_table

    reasons = ("invalid_arguments", "timeout", "tool_error", "unknown_tool", "unparsable")
    # seed 0: 8 calls of known tools + 2 unparsable turns = 10 calls; seed 1: 4 + 0 = 4 calls
    for seed, per_episode, (look, reply), errors in (
        (0, 2.0, (6, 2), (1, 0, 1, 0, 2)),
        (1, 3.0, (3, 1), (2, 0, 0, 0, 0)),
    ):
        end = {
            "step": 3,
            "rollout/tool_calls_per_episode": per_episode,
            "rollout/tool_calls/look": look,
            "rollout/tool_calls/reply": reply,
        }
        end.update({f"rollout/tool_call_errors/{reason}": count for reason, count in zip(reasons, errors)})
        write_run(
            tmp_path / f"seed={seed}",
            ["experiment=service_desk_tools", f"seed={seed}"],
            [*training_rows([0.1], [1.0], 0.0, 1.0), end],
        )
    table = tool_calls_table(group_by_label([load_run(path) for path in sorted(tmp_path.iterdir())])).splitlines()
    assert table[0] == (
        "| configuration | tool calls per episode (end) | invalid_arguments per call | timeout per call | tool_error per call "
        "| unknown_tool per call | unparsable per call |"
    )
    # invalid_arguments: 1/10 and 2/4 -> 0.3 ± 0.283; tool_error: 0.1 and 0 -> 0.05 ± 0.071; unparsable: 0.2 and 0 -> 0.1 ± 0.141
    assert (
        table[2]
        == "| service_desk_tools | 2.50 ± 0.71 | 0.300 ± 0.283 | 0.000 | 0.050 ± 0.071 | 0.000 | 0.100 ± 0.141 |"
    )
    assert (
        tool_calls_table(
            {"snapshot": [load_run(write_run(tmp_path / "plain", ["seed=0"], training_rows([0.1], [1.0], 0.0, 1.0)))]}
        )
        is None
    )


def test_kept_runs_give_the_same_table_and_hold_only_what_the_report_reads(sweep, tmp_path):
    def table(out: Path) -> list[str]:
        return [line for line in (out / "report.md").read_text().splitlines() if line.startswith("| ")]

    metrics = sweep / "experiment=snapshot,seed=0" / "metrics.csv"
    with open(metrics, newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows.append({"step": "1", "rollout/queue_depth": "3.0"})  # a column the report does not read
    with open(metrics, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*rows[0], "rollout/queue_depth"])
        writer.writeheader()
        writer.writerows(rows)
    report_main([str(sweep), "--out", str(tmp_path / "direct"), "--smooth", "1"])
    report_main([str(sweep), "--out", str(tmp_path / "kept"), "--smooth", "1", "--keep-runs", str(tmp_path / "runs")])
    assert table(tmp_path / "kept") == table(tmp_path / "direct")
    kept = tmp_path / "runs"
    assert (kept / "experiment=snapshot,seed=0" / "summary.json").is_file()
    assert (
        kept / "experiment=ppo_ewma,reference.beta=0.9,seed=0" / ".hydra" / "overrides.yaml"
    ).is_file()  # unfinished
    header = (kept / "experiment=snapshot,seed=0" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "rollout/queue_depth" not in header and {"step", "train/task_success", "val/avg@4"} <= set(header)


def test_each_run_states_its_regime_the_drift_per_version_and_the_discrepancy(tmp_path):
    # Two seeds: drift 0.02 then 0.04 (mean 0.03) and 0.05, 0.05; discrepancy 0.01, 0.01 and 0.02, 0.04.
    for seed, (drifts, discrepancies) in enumerate([((0.02, 0.04), (0.01, 0.01)), ((0.05, 0.05), (0.02, 0.04))]):
        rows = [
            {
                "step": step,
                "train/task_success": 0.5,
                "fidelity/version_drift_absmean": drift,
                "fidelity/discrepancy_absmean": discrepancy,
            }
            for step, (drift, discrepancy) in enumerate(zip(drifts, discrepancies))
        ]
        write_run(tmp_path / f"s{seed}", [f"seed={seed}"], rows)
    runs = group_by_label([load_run(tmp_path / f"s{seed}") for seed in (0, 1)])["default"]
    header, row = table_rows(results_table({"default": runs}))
    cells = dict(zip(header, row, strict=True))
    # means over seeds of each run's mean over steps, with the sample standard deviation over seeds:
    # drift 0.03 and 0.05 -> 0.04 ± 0.0141; discrepancy 0.01 and 0.03 -> 0.02 ± 0.0141
    assert cells["drift per version"] == "4.0e-02 ± 1.4e-02"
    assert cells["discrepancy"] == "2.0e-02 ± 1.4e-02"
