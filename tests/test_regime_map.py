"""The regime map report: each run's place (drift / discrepancy) and each proxy's crossing of the
mask's half-width, from hand-made run directories; and the committed map rebuilt from its data."""

from __future__ import annotations

import csv
import json
import math
import shutil
from pathlib import Path

import pytest

from lit_asyncrl.report.regime_map import closest_counts, crossing, main, map_point, mean_by_lr
from lit_asyncrl.report.runs import load_run

RESULTS = Path(__file__).parents[1] / "docs" / "results"


def make_run(root: Path, lr: float, drift: float, discrepancy: float, ewma: float, steps: int = 5) -> Path:
    run = root / f"model.lr={lr}"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"overrides": ["experiment=snapshot", f"model.lr={lr}", "seed=0"]}))
    keys = {
        "fidelity/version_drift_absmean": drift,
        "fidelity/discrepancy_absmean": discrepancy,
        "fidelity/logratio_absmean": 0.0,
        "fidelity/async_recompute/logratio_absmean": 3 * drift,
        "fidelity/async_recompute/mask_disagreement": 0.5,
        "fidelity/ewma/logratio_absmean": ewma,
        "fidelity/ewma/logratio_absmean/gap_3": ewma,
        "fidelity/ewma/mask_disagreement": 0.25,
    }
    with open(run / "metrics.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["step", *keys])
        writer.writeheader()
        for step in range(steps):
            # the first three steps (left out) are far off: only steps 3 and 4 count
            writer.writerow({"step": step, **{key: value if step >= 3 else 100.0 for key, value in keys.items()}})
    return run


def test_a_runs_place_and_distances_are_the_means_over_its_steps_after_the_window_fills(tmp_path):
    point = map_point(load_run(make_run(tmp_path, 2e-5, drift=0.004, discrepancy=0.002, ewma=0.003)), skip=3)
    assert point.lr == 2e-5 and point.ratio == pytest.approx(2.0)
    assert point.distance == {"async_recompute": pytest.approx(0.012), "ewma": pytest.approx(0.003)}
    assert point.distance_by_gap["ewma"]["gap_3"] == pytest.approx(0.003)
    assert math.isnan(point.distance_by_gap["ewma"]["gap_1"])  # never logged: no tokens of that gap
    assert point.disagreement["ewma"] == 0.25


def test_the_crossing_is_interpolated_in_log_log_between_the_runs_around_it(tmp_path):
    # ratios 1, 10, 100; ewma distances 0.001, 0.1, 1: half-width 0.01 is halfway (in logs) from 0.001
    # to 0.1, so the crossing is at ratio 10 ** 0.5
    points = [
        map_point(load_run(make_run(tmp_path, lr, drift=ratio * 0.002, discrepancy=0.002, ewma=ewma)), skip=3)
        for lr, ratio, ewma in ((1e-6, 1, 0.001), (1e-5, 10, 0.1), (1e-4, 100, 1.0))
    ]
    assert crossing(points, "ewma", 0.01) == "3.2"  # 10 ** 0.5 = 3.16, to two significant digits
    # async recompute is 3 * drift = 0.006 at ratio 1, above 0.005 everywhere
    assert crossing(points, "async_recompute", 0.005) == "above at every ratio measured (1 to 1e+02)"
    assert crossing(points, "ewma", 2.0) == "below at every ratio measured (1 to 1e+02)"
    # a dip: 0.001 at ratio 1, 0.1 at 10, then 0.001 again at 100 (runs at another rate)
    dip = [
        *points[:2],
        map_point(load_run(make_run(tmp_path / "dip", 1e-4, drift=0.2, discrepancy=0.002, ewma=0.001)), skip=3),
    ]
    assert crossing(dip, "ewma", 0.01) == "rises through at 3.2, falls back below at 32"


def test_seeds_of_a_learning_rate_are_averaged_for_the_crossing_and_the_closest_proxy_is_counted(tmp_path):
    points = [
        map_point(load_run(make_run(tmp_path / f"seed{seed}", 1e-5, drift=drift, discrepancy=0.002, ewma=ewma)), skip=3)
        for seed, drift, ewma in ((0, 0.002, 0.004), (1, 0.004, 0.008))
    ]
    (mean,) = mean_by_lr(points)
    assert (mean.drift, mean.ratio) == (pytest.approx(0.003), pytest.approx(1.5))
    assert mean.distance == {"async_recompute": pytest.approx(0.009), "ewma": pytest.approx(0.006)}
    assert closest_counts(points) == {"async_recompute": 0, "ewma": 2}  # ewma 0.004 < 0.006 and 0.008 < 0.012


def test_the_report_table_and_figure_are_written(tmp_path):
    for lr, ratio in ((1e-6, 1), (1e-5, 10)):
        make_run(tmp_path / "sweep", lr, drift=ratio * 0.002, discrepancy=0.002, ewma=0.001 * ratio)
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out"), "--mask-high", "1.01"]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert (
        "| model.lr=1e-05 | 1e-05 | 0 | 2.00e-02 | 2.00e-03 | 10 | 0.0e+00 | 6.00e-02 (0.500) | 1.00e-02 (0.250) |"
        in report
    )
    assert (tmp_path / "out" / "regime_map.png").stat().st_size > 10_000
    rows = list(csv.DictReader((tmp_path / "out" / "regime_map.csv").read_text().splitlines()))
    assert [float(row["ratio"]) for row in rows] == pytest.approx([1.0, 10.0])


@pytest.mark.parametrize("name", ["regime_map", "regime_map_smollm2"])
def test_the_committed_map_is_rebuilt_from_the_committed_runs(name, tmp_path):
    committed = RESULTS / name
    command = (committed / "command.txt").read_text().strip()
    args = json.loads((committed / "report_args.json").read_text())
    shutil.copytree(committed / "runs", tmp_path / "runs")
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), *args, "--command", command]) == 0
    assert (tmp_path / "out" / "report.md").read_text() == (committed / "report.md").read_text()
    assert (tmp_path / "out" / "regime_map.csv").read_text() == (committed / "regime_map.csv").read_text()


def test_the_kept_runs_hold_the_summary_and_the_fidelity_columns_and_give_the_same_map(tmp_path):
    for lr, ratio in ((1e-6, 1), (1e-5, 10)):
        run = make_run(tmp_path / "sweep", lr, drift=ratio * 0.002, discrepancy=0.002, ewma=0.001 * ratio)
        with open(run / "metrics.csv", "a") as handle:  # a row of another metric only: left out of the copy
            handle.write("5" + "," * 8 + "\n")
    main([str(tmp_path / "sweep"), "--out", str(tmp_path / "direct")])
    main([str(tmp_path / "sweep"), "--out", str(tmp_path / "kept"), "--keep-runs", str(tmp_path / "runs")])
    assert (tmp_path / "kept" / "report.md").read_text() == (tmp_path / "direct" / "report.md").read_text()
    copied = (tmp_path / "runs" / "model.lr=1e-06" / "metrics.csv").read_text().splitlines()
    assert copied[0].split(",")[0] == "step" and all(name.startswith("fidelity/") for name in copied[0].split(",")[1:])
    assert len(copied) == 1 + 5  # the header and the five rows with fidelity values
    assert (tmp_path / "runs" / "model.lr=1e-06" / "summary.json").is_file()
