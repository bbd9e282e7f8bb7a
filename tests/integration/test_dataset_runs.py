"""A prompt dataset trains through both front ends on the real engine (`env=dataset`)."""

import json
import sys

import pytest

from tests.support.runs import SMALL_KV_CACHE_GIB, SMALL_RUN, read_all_rows, read_rows, run_command, run_hydra

pytestmark = pytest.mark.engine

#: Every row's `answer` column reaches it by name; 1.0 on each (digits): every episode a success.
REWARD = "tests.support.reward_functions.answer_column_reached"


def sums_file(folder):
    path = folder / "sums.jsonl"
    rows = [
        {"prompt": f"{a}+{b}=", "answer": str(a + b), "split": "test" if b == 3 else "train"}
        for a in range(10)
        for b in range(5)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_dataset_file_trains_through_hydra_and_the_lightning_cli(tmp_path):
    data = sums_file(tmp_path)
    hydra_dir = tmp_path / "hydra"
    run_hydra(
        [
            *SMALL_RUN,
            "model.warm_start_steps=0",
            "env=dataset",
            f"env.path={data}",
            "env.split_key=split",
            "env.max_turn_tokens=4",
            f"env.rewards=[{REWARD}]",
            "trainer.max_steps=3",
            f"hydra.run.dir={hydra_dir}",
        ]
    )
    cli_dir = tmp_path / "cli"
    command = [sys.executable, "-m", "lit_asyncrl.cli", "fit", "--config", "conf/cli/default.yaml"]
    command += ["--trainer.max_steps", "3", "--trainer.default_root_dir", str(cli_dir)]
    command += ["--trainer.logger.init_args.save_dir", str(cli_dir), "--warm_start.steps", "0"]
    command += ["--data.rollout.batch.group_size", "4", "--data.rollout.batch.groups_per_batch", "4"]
    command += ["--data.rollout.engine.kv_cache_gib", str(SMALL_KV_CACHE_GIB)]
    command += ["--data.env", "lit_asyncrl.envs.DatasetEnv", "--data.env.init_args.path", str(data)]
    command += ["--data.env.init_args.split_key", "split", "--data.env.init_args.rewards", f"[{REWARD}]"]
    run_command(command)
    for run_dir in (hydra_dir, cli_dir):
        (csv_path,) = run_dir.glob("**/metrics.csv")
        rows = read_rows(csv_path)
        assert [row["train/task_success"] for row in rows] == [1.0, 1.0, 1.0]
        # The function's own metric, each step: its value where it scored, and it scored every episode.
        logged = [row for row in read_all_rows(csv_path) if f"train/rewards/{REWARD}" in row]
        assert [(row[f"train/rewards/{REWARD}"], row[f"train/rewards/{REWARD}/scored"]) for row in logged] == [
            (1.0, 1.0)
        ] * 3
        # The held-out rows (b == 3: ten prompts) were played before RL, all scored by the same function.
        validated = [row for row in read_all_rows(csv_path) if "val/avg@4" in row]
        assert validated[0]["val/avg@4"] == 1.0
