"""Run directories written by hand as a Hydra job leaves them, and the rows of the report's tables."""

from __future__ import annotations

import csv
from pathlib import Path

from lit_asyncrl.run_summary import write_summary


def write_run(path: Path, overrides: list[str], rows: list[dict], finished: bool = True, wall_s: float = 120.0) -> Path:
    """A run directory as a Hydra job leaves it: metrics.csv, .hydra/overrides.yaml, summary.json."""
    path.mkdir(parents=True)
    keys = sorted({key for row in rows for key in row})
    with open(path / "metrics.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    (path / ".hydra").mkdir()
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {item}\n" for item in overrides))
    if finished:
        write_summary(path, overrides, wall_s, {"train/task_success": 0.5})
    return path


def table_rows(report: str, after: str = "") -> list[list[str]]:
    """The rows (header first, no separator) of the first markdown table after the line that starts
    with `after` (the report's first table, the results, by default)."""
    lines = report.splitlines()
    heading = next(index for index, line in enumerate(lines) if line.startswith(after)) if after else -1
    start = next(index for index, line in enumerate(lines) if index > heading and line.startswith("| "))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        if not line.startswith("|---"):
            rows.append(line.strip("| ").split(" | "))
    return rows
