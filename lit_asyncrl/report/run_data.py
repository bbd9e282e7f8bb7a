"""The data behind a committed report: each run's `summary.json` and the metric columns the report
reads, copied beside it so that the report can be rebuilt from the repository alone."""

from __future__ import annotations

import csv
import shutil
from collections.abc import Sequence
from pathlib import Path

from lit_asyncrl.run_summary import SUMMARY_FILE

#: What says which configuration a run was: its summary (a finished run), else Hydra's record of its overrides.
RUN_RECORDS = (SUMMARY_FILE, ".hydra/overrides.yaml")


def keep_run_data(run_dirs: Sequence[Path], dest: Path, prefixes: Sequence[str]) -> list[Path]:
    """Copy each run's summary (or, for a run that did not finish, its overrides) and the `step`
    column plus every column starting with one of `prefixes` of its metrics.csv to
    `dest/<run name>/`; returns the copies' directories.

    Raises:
        ValueError: when a run has neither record (nothing would say what it ran).
    """
    kept = []
    for run_dir in run_dirs:
        record = next((name for name in RUN_RECORDS if (run_dir / name).is_file()), None)
        if record is None:
            raise ValueError(f"{run_dir} has no {' or '.join(RUN_RECORDS)}: nothing says what it ran")
        target = dest / run_dir.name
        (target / record).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(run_dir / record, target / record)
        with open(run_dir / "metrics.csv", newline="") as source:
            reader = csv.DictReader(source)
            columns = [
                "step",
                *(name for name in reader.fieldnames or [] if name != "step" and name.startswith(tuple(prefixes))),
            ]
            rows = [{name: row[name] for name in columns} for row in reader]
        with open(target / "metrics.csv", "w", newline="") as out:
            writer = csv.DictWriter(out, columns)
            writer.writeheader()
            writer.writerows(row for row in rows if any(row[name] for name in columns[1:]))
        kept.append(target)
    return kept
