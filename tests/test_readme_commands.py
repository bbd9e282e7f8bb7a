"""Every Hydra command in the README and docs/ builds its run: module, datamodule, warm
start and trainer (GPU commands only where a GPU is; Hydra's own `hydra...` settings are left out).

The commands are read from the README itself (`python -m lit_asyncrl.train ...` and
`make train ARGS="..."`), a sweep's comma lists expanded into its jobs, and each is built with
`lit_asyncrl.train.build`, which checks every value and combination and starts nothing. Running
them is the integration tests' job; this catches a README command whose config is wrong (the
README's own sweep once failed its second job only after the engine started).
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest
import torch

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.train import build
from tests.support.configs import compose_train
from tests.support.experiment_data import experiment_data
from tests.support.xdist_groups import grouped_by_imports

README = Path(__file__).resolve().parents[1] / "README.md"
#: The README and every page of docs/ (the findings' sweeps, the benchmarks' runs, scaling out).
DOCUMENTS = [README, *sorted((README.parent / "docs").glob("*.md"))]


def _problems_file(folder: Path) -> str:
    path = folder / "problems.jsonl"
    path.write_text("".join(f'{{"prompt": "{a}+1=", "answer": "{a + 1}"}}\n' for a in range(20)))
    return str(path)


# Placeholders in the README and what stands in for them here (made in the test's own folder).
PLACEHOLDERS = {
    "/path/to/local/hf/model": lambda folder: str(resolve_model_path(None)),
    "problems.jsonl": _problems_file,
    "my_rewards.format_reward": lambda folder: "tests.support.reward_functions.format_reward_func",
    "my_agent.solve": lambda folder: "lit_asyncrl.examples.arithmetic_agent.solve",
    "my_agent.draw": lambda folder: "lit_asyncrl.examples.arithmetic_agent.draw_sum",
}


def readme_commands() -> list[list[str]]:
    """Override lists of every Hydra command in the README and docs/ (one per sweep job)."""
    commands = []
    text = "\n".join(document.read_text() for document in DOCUMENTS).replace("\\\n", " ")  # continued lines joined
    for line in text.splitlines():
        line = line.strip().strip("`")
        found = re.search(r"-m lit_asyncrl\.train\b(.*)", line) or re.search(r'make train ARGS="([^"]*)"', line)
        if found is None:
            continue
        arguments = [
            token
            for token in shlex.split(found.group(1), comments=True)
            if token != "-m" and not token.startswith("hydra")
        ]
        if "trainer.accelerator=gpu" in arguments and not torch.cuda.is_available():
            continue
        if any("<" in token or "=" not in token for token in arguments):
            continue  # prose (words, a <placeholder>), not a command
        choices = [token.split("=", 1) for token in arguments]
        # A sweep: key=a,b (outside brackets) is one job per value.
        expanded = [[f"{key}={value}" for value in _sweep_values(values)] for key, values in choices]
        commands += [list(job) for job in itertools.product(*expanded) if list(job) not in commands]  # once each
    return commands


def _sweep_values(values: str) -> list[str]:
    return [values] if "[" in values else values.split(",")


#: A command that is only `experiment=<name>` is built by tests/test_configs.py's test of every experiment.
COMMANDS = [
    command for command in readme_commands() if not (len(command) == 1 and command[0].startswith("experiment="))
]


def test_the_readme_has_its_commands():
    assert len(COMMANDS) >= 12
    assert ["loss=decoupled_ppo", "reference=async_recompute"] in COMMANDS  # the sweep's second job


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(command, id=" ".join(command) or "(default)", marks=grouped_by_imports(command))
        for command in COMMANDS
    ],
)
def test_every_readme_command_builds_its_run(overrides, tmp_path):
    overrides = [_substitute(token, tmp_path) for token in overrides]
    # An experiment that reads a file its user writes first (the word problems) gets one made here.
    data = [f"{key}={value}" for key, value in experiment_data(overrides, tmp_path).items()]
    cfg = compose_train(
        [
            *overrides,
            *data,
            f"hydra.run.dir={tmp_path}",
            f"hydra.runtime.output_dir={tmp_path}",  # a Hydra app sets it (the live loggers' dir); compose does not
            f"trainer.default_root_dir={tmp_path}",
            f"trainer.logger.save_dir={tmp_path}",
        ]
    )
    module, datamodule, _, trainer = build(cfg)
    assert datamodule.rollouts.engine is None  # nothing started
    assert trainer.max_steps == cfg.trainer.max_steps


def _substitute(token: str, folder: Path) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        if placeholder in token:
            token = token.replace(placeholder, value(folder))
    return token
