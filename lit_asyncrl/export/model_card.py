"""The exported folder's README.md: what the model is, how it was trained, where it ended."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

#: The final metrics the card quotes, where the run logged them.
QUOTED_METRICS = ("train/task_success", "val/avg@", "val/pass@", "val/greedy_success", "rollout/epochs")


def final_metrics(run_dir: Path | None) -> dict[str, float]:
    """The last logged value of each quoted metric in `<run_dir>/**/metrics.csv` (none without one)."""
    if run_dir is None:
        return {}
    found = sorted(run_dir.glob("**/metrics.csv"))
    if not found:
        return {}
    last: dict[str, float] = {}
    with found[0].open() as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if value not in ("", None) and key.startswith(QUOTED_METRICS):
                    last[key] = float(value)
    return last


def run_config(run_dir: Path | None) -> str | None:
    """The run's own config as it wrote it (Hydra's `.hydra/config.yaml`, or the CLI's `config.yaml`)."""
    if run_dir is None:
        return None
    for candidate in (run_dir / ".hydra" / "config.yaml", *sorted(run_dir.glob("**/config.yaml"))):
        if candidate.is_file():
            return candidate.read_text()
    return None


def model_card(kind: str, checkpoint: Path, step: int, hyper_parameters: dict[str, Any], run_dir: Path | None) -> str:
    """The card's text: the export's kind (`model`, `adapter`, `merged`, with the weights it holds)."""
    lines = [
        "---",
        "library_name: " + ("peft" if kind.startswith("adapter") else "transformers"),
        "tags: [lit_asyncrl, reinforcement-learning]",
        "---",
        "",
        f"# {kind}, exported by lit_asyncrl",
        "",
        f"From `{checkpoint}` at optimizer step {step}. The module's settings:",
        "",
        "```json",
        json.dumps(hyper_parameters, indent=2, default=str),
        "```",
    ]
    metrics = final_metrics(run_dir)
    if metrics:
        lines += ["", "Last logged values of the run:", "", "| metric | value |", "|---|---:|"]
        lines += [f"| `{key}` | {value:.4g} |" for key, value in sorted(metrics.items())]
    config = run_config(run_dir)
    if config is not None:
        lines += ["", "The run's config:", "", "```yaml", config.rstrip(), "```"]
    return "\n".join(lines) + "\n"
