"""The analysis a sweep commits to before its first run: the primary endpoint and the families of
comparisons, written in the sweep's own config (`analysis:`) and read by `lit-asyncrl report --plan`.

Committing them with the sweep, before any result exists, is what lets a reader trust that the
endpoint and the comparisons were not chosen after looking at the runs (git dates the commit).

    analysis:
      endpoint_evaluations: 3          # the mean of the last 3 held-out evaluations of each run
      families:                        # each family is one Holm family, one table in the report
        exact_vs_proxies:
          - [snapshot, ppo_ewma]       # A, B as the report's labels name them
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from lit_asyncrl.config_dir import config_dir
from lit_asyncrl.report.runs import Run


@dataclass(frozen=True)
class Endpoint:
    """A run's held-out score: the mean of its last `evaluations` evaluations after the first one
    (the first is taken before any RL step and is the start, not the end)."""

    evaluations: int = 1

    def score(self, run: Run, key: str) -> float | None:
        """None when the run has fewer evaluations after its start than the endpoint averages."""
        after_start = run.values(key)[1:]
        if len(after_start) < self.evaluations:
            return None
        return statistics.fmean(after_start[-self.evaluations :])

    def describe(self) -> str:
        if self.evaluations == 1:
            return "the last held-out evaluation"
        return f"the mean of the last {self.evaluations} held-out evaluations"

    def column(self) -> str:
        return "end" if self.evaluations == 1 else f"mean of last {self.evaluations}"


@dataclass(frozen=True)
class AnalysisPlan:
    endpoint: Endpoint
    families: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    source: str = ""  # the file the plan was read from, stated in the report


def load_plan(spec: str) -> AnalysisPlan:
    """The `analysis:` block of a YAML file (a path) or of a shipped sweep (`table2_rerun` reads
    conf/sweep/table2_rerun.yaml).

    Raises:
        SystemExit: naming `--plan` and the key as written, when the file or a key is missing or wrong.
    """
    path = Path(spec)
    # Stated in the report as the user wrote it, or as the repository names a shipped sweep: an
    # absolute path would tie a committed report to the checkout that built it.
    source = spec
    if not path.is_file():
        path = Path(config_dir()) / "sweep" / f"{spec}.yaml"
        source = f"conf/sweep/{spec}.yaml"
    if not path.is_file():
        raise SystemExit(f"--plan {spec}: neither a file nor a sweep of conf/sweep/")
    block = OmegaConf.to_container(OmegaConf.load(path)).get("analysis")
    if not isinstance(block, dict):
        raise SystemExit(f"--plan {spec}: {path} has no `analysis:` block")
    evaluations = block.get("endpoint_evaluations", 1)
    if isinstance(evaluations, bool) or not isinstance(evaluations, int) or evaluations < 1:
        raise SystemExit(f"--plan {spec}: analysis.endpoint_evaluations must be an integer >= 1, got {evaluations!r}")
    families = block.get("families")
    if not isinstance(families, dict) or not families:
        raise SystemExit(f"--plan {spec}: analysis.families must map a family's name to its pairs")
    return AnalysisPlan(
        endpoint=Endpoint(evaluations),
        families={name: _pairs(spec, name, pairs) for name, pairs in families.items()},
        source=source,
    )


def _pairs(spec: str, name: str, pairs: object) -> list[tuple[str, str]]:
    valid = isinstance(pairs, list) and pairs and all(isinstance(pair, list) and len(pair) == 2 for pair in pairs)
    if not valid:
        raise SystemExit(f"--plan {spec}: analysis.families.{name} must be a list of [A, B] pairs, got {pairs!r}")
    return [(str(first), str(second)) for first, second in pairs]
