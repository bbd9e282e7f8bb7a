"""Which panels the training-curves PNG draws, and that it draws them from a metrics.csv."""

from __future__ import annotations

from lit_asyncrl.plots import DEFAULT_PANELS, panel_lines, plot_training_curves


def test_a_single_task_run_gets_one_panel_per_metric():
    names = ["train/task_success", "val/avg@4", "val/pass@4", "train/entropy", "epoch"]
    assert panel_lines(names, DEFAULT_PANELS) == [
        ("train/task_success", [("train/task_success", "")]),
        ("val/avg@4", [("val/avg@4", "")]),
        ("val/pass@4", [("val/pass@4", "")]),
        ("train/entropy", [("train/entropy", "")]),
    ]


def test_a_mixture_gets_one_panel_with_a_line_per_task():
    names = [
        "train/task_success",
        "train/guess/task_success",
        "train/desk/task_success",
        "val/avg@4",
        "val/desk/avg@4",
        "val/guess/avg@4",
    ]
    panels = dict(panel_lines(names, ("train/task_success", "train/*/task_success", "val/avg@*", "val/*/avg@*")))
    assert panels["train/<task>/task_success"] == [
        ("train/desk/task_success", "desk"),
        ("train/guess/task_success", "guess"),
    ]
    assert panels["val/<task>/avg@4"] == [("val/desk/avg@4", "desk"), ("val/guess/avg@4", "guess")]
    # The overall held-out metric keeps its own panel, not a line among the tasks'.
    assert panels["val/avg@4"] == [("val/avg@4", "")]
    assert list(panels) == ["train/task_success", "train/<task>/task_success", "val/avg@4", "val/<task>/avg@4"]


def test_the_png_is_written_from_a_mixtures_metrics_csv(tmp_path):
    csv_path = tmp_path / "metrics.csv"
    csv_path.write_text(
        "step,train/task_success,train/desk/task_success,val/desk/avg@4\n0,0.5,0.25,\n1,0.75,,0.5\n2,0.5,1.0,\n"
    )
    png = plot_training_curves(csv_path, tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
