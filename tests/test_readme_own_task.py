"""The README's own-task example, as a user outside the repository would use it: its code written to a
module of their own, named in a Hydra config dir of their own and in the Lightning CLI; both front
ends build a run on it (nothing starts)."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A folder holding the README's `my_tasks.py` and `my_conf/env/parrot.yaml`, on sys.path."""
    text = README.read_text()
    code = re.search(r"```python\n# my_tasks\.py[^\n]*\n(.*?)```", text, re.S).group(1)
    target = re.search(r"#\s+(_target_: my_tasks\.\w+)", text).group(1)
    (tmp_path / "my_tasks.py").write_text(code)
    (tmp_path / "my_conf" / "env").mkdir(parents=True)
    (tmp_path / "my_conf" / "env" / "parrot.yaml").write_text(target + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_tasks", None)


def test_the_example_task_plays_as_written(user_dir):
    import my_tasks

    from lit_asyncrl.rollout.serving.instances import held_out_instances, training_instance

    env = my_tasks.Parrot()
    digit = training_instance(env, random.Random(0))
    episode = env.new_episode(digit)
    assert episode.reset() == f"{digit}?"
    assert episode.step(f"{digit};") == ("", 1.0, True, False, {"success": True})
    assert env.new_episode(digit).step(f"{(digit + 1) % 10};").reward == 0.0
    held_out = held_out_instances(env, 10)
    assert held_out and all(0 <= d <= 9 for d in held_out)
    assert not {training_instance(env, random.Random(seed)) for seed in range(200)} & set(held_out)


def test_hydra_builds_a_run_on_the_example_task_from_a_config_dir_of_ones_own(user_dir, tmp_path):
    from lit_asyncrl.train import build
    from tests.support.configs import compose_train

    run_dir = tmp_path / "run"
    searchpath = f"hydra.searchpath=[file://{user_dir / 'my_conf'}]"  # what --config-dir my_conf adds
    cfg = compose_train(
        [
            "env=parrot",
            searchpath,
            f"hydra.run.dir={run_dir}",
            f"trainer.default_root_dir={run_dir}",
            f"trainer.logger.save_dir={run_dir}",
        ]
    )
    _, datamodule, _, _ = build(cfg)
    assert type(datamodule.env).__name__ == "Parrot" and type(datamodule.env).__module__ == "my_tasks"


def test_the_lightning_cli_builds_a_run_on_the_example_task_by_its_class_path(user_dir, tmp_path):
    from lit_asyncrl.cli import AsyncRLCLI
    from lit_asyncrl.config_dir import config_dir
    from lit_asyncrl.datamodule import RolloutDataModule
    from lit_asyncrl.module import AsyncRLModule

    arguments = [
        "--config",
        f"{config_dir()}/cli/default.yaml",
        "--data.env",
        "my_tasks.Parrot",
        "--trainer.default_root_dir",
        str(tmp_path),
    ]
    cli = AsyncRLCLI(AsyncRLModule, RolloutDataModule, run=False, args=arguments)
    assert type(cli.datamodule.env).__name__ == "Parrot"


def test_a_task_class_named_in_the_cli_starts_from_its_own_defaults(tmp_path):
    # The config's range game sets malformed_reward -0.2 and max_turns 4; the desk's defaults are
    # -0.1 and 4, and jsonargparse alone would carry the -0.2 over. A setting given after the class applies.
    from lit_asyncrl.cli import AsyncRLCLI
    from lit_asyncrl.config_dir import config_dir
    from lit_asyncrl.datamodule import RolloutDataModule
    from lit_asyncrl.module import AsyncRLModule

    arguments = ["--config", f"{config_dir()}/cli/default.yaml", "--data.env", "lit_asyncrl.envs.ServiceDeskEnv"]
    arguments += ["--data.env.init_args.max_turns", "6", "--trainer.default_root_dir", str(tmp_path)]
    cli = AsyncRLCLI(AsyncRLModule, RolloutDataModule, run=False, args=arguments)
    settings = cli.config["data"]["env"]["init_args"]
    assert settings["malformed_reward"] == -0.1
    assert settings["max_turns"] == 6
    assert settings["difficulty"] == "easy"
    assert "span" not in settings and "held_out" not in settings


def test_every_spelling_of_a_task_class_is_preceded_by_a_reset_and_nothing_else_is():
    from lit_asyncrl.cli import tasks_start_from_their_defaults

    reset = ["--data.env", "null"]
    named = ["fit", "--data.env", "my.Task", "--data.env.init_args.k", "1"]
    assert tasks_start_from_their_defaults(named) == ["fit", *reset, *named[1:]]
    assert tasks_start_from_their_defaults(["--data.env=my.Task"]) == [*reset, "--data.env=my.Task"]
    by_class_path = ["--data.env.class_path", "my.Task"]
    assert tasks_start_from_their_defaults(by_class_path) == [*reset, *by_class_path]
    untouched = ["--data.env", '{"init_args": {"k": 1}}', "--data.env.max_turns", "3", "--data.env", "null"]
    assert tasks_start_from_their_defaults(untouched) == untouched
