"""A dataset task's rows, read offline with Hugging Face `datasets`: a local json, jsonl, parquet or
csv file, or a folder written by `Dataset.save_to_disk`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: `datasets`' builder for each file suffix.
BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def read_rows(path: str, key: str) -> list[dict[str, Any]]:
    """Every row of the file or folder `path` as a dict; `key` names the setting in errors (`env.path`)."""
    location = Path(path).expanduser()
    if not location.exists():
        raise FileNotFoundError(f"{key}={path}: no such file or folder")
    if location.is_file() and location.suffix not in BUILDERS:
        raise ValueError(f"{key}={path}: a dataset file ends in one of {sorted(BUILDERS)}, or is a save_to_disk folder")
    # `datasets` reads local files without the hub; its one network call is a telemetry request.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()  # Lightning's progress bar is the console's one
    if location.is_dir():
        loaded = datasets.load_from_disk(str(location))
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise ValueError(f"{key}={path}: a folder of splits {sorted(loaded)} has no 'train' split")
            loaded = loaded["train"]
    else:
        loaded = datasets.load_dataset(BUILDERS[location.suffix], data_files=str(location), split="train")
    return loaded.to_list()


def require_columns(rows: list[dict[str, Any]], columns: dict[str, str], path: str) -> None:
    """Refuse rows without a column a setting names (`columns`: setting -> column), naming both."""
    if not rows:
        raise ValueError(f"{path}: the dataset has no rows")
    present = set(rows[0])
    for setting, column in columns.items():
        if column not in present:
            raise ValueError(f"{setting}={column!r}: {path} has no such column (its columns: {sorted(present)})")
