"""Run directories as records: what was run (label, seed), its metric series and its summary."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from lit_asyncrl.plots import read_metrics
from lit_asyncrl.run_summary import read_summary

#: Overrides that say how a job was launched, not what it ran.
LAUNCH_KEYS = ("sweep", "+sweep", "skip_finished", "findings_part", "seed")


@dataclass
class Run:
    """One run directory (a Hydra job with `metrics.csv`)."""

    path: Path
    label: str  # what was run: its overrides without seed and launch keys, e.g. "snapshot"
    seed: int
    series: dict[str, list[tuple[int, float]]]
    summary: dict | None = field(default=None)  # None: the run did not finish (killed, or still running)

    def values(self, key: str) -> list[float]:
        """The finite values of `key` in step order (a non-finite value says nothing to average)."""
        return [value for _, value in self.series.get(key, []) if math.isfinite(value)]

    def last(self, key: str) -> float | None:
        values = self.values(key)
        return values[-1] if values else None


def load_run(path: Path) -> Run:
    """Read a run directory; ValueError naming the path when it holds no metrics.csv."""
    path = Path(path)
    csv_path = path / "metrics.csv"
    if not csv_path.is_file():
        raise ValueError(f"{path} is not a run directory: it has no metrics.csv")
    overrides = _overrides(path)
    seed = 0
    for item in overrides:
        key, _, value = item.partition("=")
        if key.lstrip("+") == "seed":
            seed = int(value)
    return Run(
        path=path, label=run_label(overrides), seed=seed, series=read_metrics(csv_path), summary=read_summary(path)
    )


def run_label(overrides: list[str]) -> str:
    """`experiment=snapshot,reference.beta=0.9` -> `snapshot reference.beta=0.9` (seed and launch keys dropped)."""
    kept = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.lstrip("+~") in LAUNCH_KEYS or key.startswith("hydra."):
            continue
        kept.append(value if key == "experiment" else item)
    return " ".join(kept) or "default"


def _overrides(path: Path) -> list[str]:
    summary = read_summary(path)
    if summary is not None:
        return list(summary["overrides"])
    hydra_overrides = path / ".hydra" / "overrides.yaml"
    if hydra_overrides.is_file():
        return list(OmegaConf.to_container(OmegaConf.load(hydra_overrides)))
    return []


def group_by_label(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs of the same configuration (different seeds) together, in the order first seen."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    for members in groups.values():
        members.sort(key=lambda run: run.seed)
    return groups
