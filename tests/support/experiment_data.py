"""The data an experiment reads from a file its user writes first, made in a test's own folder."""

from __future__ import annotations

from pathlib import Path

from lit_asyncrl.examples import word_problems


def _word_problems(folder: Path) -> dict[str, str]:
    """The file `experiment=smollm2_dataset` reads, written by its example script into `folder`."""
    path = folder / "word_problems.jsonl"
    word_problems.main([str(path)])
    return {"env.path": str(path)}


#: Experiment name -> what makes its data in a folder and the settings that point at it.
EXPERIMENT_DATA = {"smollm2_dataset": _word_problems}


def experiment_data(overrides: list[str], folder: Path) -> dict[str, str]:
    """The settings pointing the experiment that `overrides` name (if any) at its data, made in `folder`."""
    for override in overrides:
        key, _, name = override.partition("=")
        if key == "experiment" and name in EXPERIMENT_DATA:
            return EXPERIMENT_DATA[name](folder)
    return {}
