"""Training curves as a PNG next to the run's metrics.csv, written when fit ends."""

from __future__ import annotations

import csv
import fnmatch
import re
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override

DEFAULT_PANELS = (
    "train/task_success",
    "train/*/task_success",
    "val/avg@*",
    "val/pass@*",
    "val/*/avg@*",
    "train/train_infer_mask",
    "train/ppo_clip_ratio",
    "train/version_gap_mean",
    "train/entropy",
    "rollout/queue_depth",
    "rollout/tool_calls_per_episode",  # tool tasks only
)


def read_metrics(csv_path: Path) -> dict[str, list[tuple[int, float]]]:
    """Columns of a Lightning CSVLogger file as (step, value) series, skipping empty cells."""
    series: dict[str, list[tuple[int, float]]] = {}
    with open(csv_path, newline="") as handle:
        for row in csv.DictReader(handle):
            step = int(float(row.get("step") or 0))
            for key, value in row.items():
                if key != "step" and value not in (None, ""):
                    series.setdefault(key, []).append((step, float(value)))
    return series


def panel_lines(names: list[str], panels: tuple[str, ...]) -> list[tuple[str, list[tuple[str, str]]]]:
    """The panels to draw from the metric `names` present: (title, [(metric, line label)]).

    A panel name is a metric (one line), a prefix ending in `*` (a panel of its own for every metric
    with that prefix: `val/avg@*` gives `val/avg@4`), or a pattern with a `*` before its end (one
    panel with a line per match, labelled by what the first `*` matched: `val/*/avg@*` draws each
    task of a mixture, titled `val/<task>/avg@4`). Panels with nothing present are left out.
    """
    drawn = []
    for panel in panels:
        if "*" in panel[:-1]:
            label = re.compile(re.escape(panel).replace(r"\*", "(.*)"))
            matches = sorted(name for name in names if fnmatch.fnmatchcase(name, panel))
            if matches:
                lines = [(name, label.fullmatch(name).group(1)) for name in matches]
                first, first_label = lines[0]
                title = first.replace(f"/{first_label}/", "/<task>/", 1)
                drawn.append((title, lines))
        elif panel.endswith("*"):
            drawn += [(name, [(name, "")]) for name in sorted(n for n in names if n.startswith(panel[:-1]))]
        elif panel in names:
            drawn.append((panel, [(panel, "")]))
    return drawn


def plot_training_curves(csv_path: Path, png_path: Path, panels: tuple[str, ...] = DEFAULT_PANELS) -> Path:
    """Draw one panel per metric present in `csv_path` and save them as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = read_metrics(csv_path)
    present = panel_lines(list(series), panels)
    columns = min(max(len(present), 1), 3)
    rows = -(-max(len(present), 1) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.2 * rows), squeeze=False)
    for axis in axes.flat[len(present) :]:
        axis.set_visible(False)
    for axis, (title, lines) in zip(axes.flat, present):
        for key, label in lines:
            steps, values = zip(*series[key])
            # Held-out metrics come every few hundred steps: mark the points.
            axis.plot(
                steps,
                values,
                linewidth=1.2,
                marker="o" if key.startswith("val/") else None,
                markersize=3,
                label=label or None,
            )
        if any(label for _, label in lines):
            axis.legend(fontsize=7)
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return png_path


class TrainingCurvesPlot(L.Callback):
    """Saves `training_curves.png` beside the logger's `metrics.csv` at the end of fit."""

    def __init__(self, filename: str = "training_curves.png", panels: tuple[str, ...] = DEFAULT_PANELS) -> None:
        self.filename = filename
        self.panels = tuple(panels)

    @override
    @rank_zero_only
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.logger is None or trainer.logger.log_dir is None:
            return
        trainer.logger.save()
        csv_path = Path(trainer.logger.log_dir) / "metrics.csv"
        if csv_path.exists():
            png = plot_training_curves(csv_path, Path(trainer.logger.log_dir) / self.filename, self.panels)
            pl_module.print(f"training curves: {png}")
