"""Runs of the Hydra entry that benchmarks compare side by side, and medians of their logged metrics."""

from __future__ import annotations

import csv
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_steps(overrides: list[str], out_dir: Path) -> list[dict[str, float]]:
    """Train with `overrides` into `out_dir`; the metric rows of its RL steps (the first has no
    `train/step_s`: its time has no previous step to start from)."""
    command = [sys.executable, "-m", "lit_asyncrl.train", *overrides, f"hydra.run.dir={out_dir}"]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, text=True)
    with open(out_dir / "metrics.csv", newline="") as handle:
        rows = [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(handle)]
    return [row for row in rows if "train/task_success" in row]


def median(rows: list[dict[str, float]], key: str, skip: int) -> float:
    """The median of `key` over the rows after the first `skip` (nan where none has it)."""
    values = [row[key] for row in rows[skip:] if key in row]
    return statistics.median(values) if values else float("nan")
