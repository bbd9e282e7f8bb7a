"""A prompt dataset trains through both front ends on the real engine (`env=dataset`), and a run
killed and resumed plays each prompt once per epoch."""

import collections
import json
import pickle

import pytest
import torch

from lit_asyncrl.kill_points import KILL_AT
from lit_asyncrl.models.char_tokenizer import build_char_tokenizer
from tests.support.preloaded_runs import run_preloaded
from tests.support.runs import (
    SMALL_KV_CACHE_GIB,
    SMALL_RUN,
    read_all_rows,
    read_rows,
    run_cli,
    run_hydra,
)

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


def dataset_run(data) -> list[str]:
    """A small Hydra run on the dataset file `data`: 4-token answers, the `split` column, every answer rewarded."""
    return [
        *SMALL_RUN,
        "model.warm_start_steps=0",
        "env=dataset",
        f"env.path={data}",
        "env.split_key=split",
        "env.max_turn_tokens=4",
        f"env.rewards=[{REWARD}]",
    ]


def test_a_dataset_file_trains_through_hydra_and_the_lightning_cli(tmp_path):
    data = sums_file(tmp_path)
    hydra_dir = tmp_path / "hydra"
    run_hydra(
        [
            *dataset_run(data),
            "trainer.max_steps=3",
            f"hydra.run.dir={hydra_dir}",
        ]
    )
    cli_dir = tmp_path / "cli"
    command = ["fit", "--config", "conf/cli/default.yaml"]
    command += ["--trainer.max_steps", "3", "--trainer.default_root_dir", str(cli_dir)]
    command += ["--trainer.logger.init_args.save_dir", str(cli_dir), "--warm_start.steps", "0"]
    command += ["--data.rollout.batch.group_size", "4", "--data.rollout.batch.groups_per_batch", "4"]
    command += ["--data.rollout.engine.kv_cache_gib", str(SMALL_KV_CACHE_GIB)]
    command += ["--data.env", "lit_asyncrl.envs.DatasetEnv", "--data.env.init_args.path", str(data)]
    command += ["--data.env.init_args.split_key", "split", "--data.env.init_args.rewards", f"[{REWARD}]"]
    run_cli(command)
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


def prompt_of(episode: dict) -> str:
    """The prompt an episode played: its tokens before the policy's first (the tiny policy's characters)."""
    first_sampled = episode["loss_mask"].index(1) if 1 in episode["loss_mask"] else len(episode["loss_mask"])
    return build_char_tokenizer().decode(episode["token_ids"][:first_sampled], skip_special_tokens=True)


def trained_groups(run_dir, steps) -> list[str]:
    """The prompt of each group the run trained at `steps` (its episodes all played that prompt)."""
    prompts = collections.defaultdict(set)
    for step in steps:
        for line in (run_dir / "trained_episodes" / f"step={step}.jsonl").read_text().splitlines():
            row = json.loads(line)
            prompts[(step, row["group_id"])].add(prompt_of({"token_ids": row["input_ids"], **row}))
    assert all(len(played) == 1 for played in prompts.values()), prompts
    return [played.pop() for played in prompts.values()]


def test_a_run_killed_and_resumed_deals_every_prompt_once_per_epoch(tmp_path):
    data = sums_file(tmp_path)  # 40 training prompts (b != 3)
    training = [f"{a}+{b}=" for a in range(10) for b in range(5) if b != 3]
    run = [
        *dataset_run(data),
        # Every answer waits 0.1 s, so a checkpoint finds groups both pending and in flight.
        "env.latency_s=0.1",
        "rollout.groups_per_batch=8",
        "rollout.max_concurrent_groups=8",
        "rollout.buffer_capacity=64",
        # No group goes stale (a stale one is dropped, counted; here every dealt prompt must be seen).
        "rollout.max_version_gap=20",
        "trainer.num_sanity_val_steps=0",
        "checkpoint_every=2",
        "save_trained_episodes=true",
    ]
    first, second = tmp_path / "first", tmp_path / "second"
    killed = run_preloaded(
        "lit_asyncrl.train",
        [*run, "trainer.max_steps=50", f"hydra.run.dir={first}"],
        timeout_s=300,
        env={KILL_AT: "train_step@3"},
    )
    assert killed.returncode == -9, killed.stdout[-3000:] + killed.stderr[-3000:]
    (checkpoint,) = (first / "checkpoints").glob("step=*.ckpt")
    assert checkpoint.name == "step=2.ckpt"
    run_hydra([*run, "trainer.max_steps=6", f"ckpt_path='{checkpoint}'", f"hydra.run.dir={second}"])

    # Every prompt dealt over the two segments: trained (the first segment's steps up to the
    # checkpoint, then the second's), or pending or in flight at the second segment's last checkpoint.
    dealt = trained_groups(first, range(2)) + trained_groups(second, range(2, 6))
    (last,) = (second / "checkpoints").glob("step=*.ckpt")
    assert last.name == "step=6.ckpt"
    service = torch.load(last, map_location="cpu", weights_only=False)["RolloutDataModule"]["rollout_service"]
    dealt += [prompt_of(group[0]) for group in service["accounting"]["pending_groups"]]
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    dealt += [rows[pickle.loads(group["instance"])]["prompt"] for group in service["in_flight"]]
    # 6 steps of 8 groups: more than the 40 prompts of the first epoch, so the second has begun.
    epoch, position = service["training_draws"][None]["epoch"], service["training_draws"][None]["position"]
    assert epoch == 1 and len(dealt) == 40 + position
    counts = collections.Counter(dealt)
    # Each prompt once in the first epoch, and those the second epoch dealt once more: none twice in
    # an epoch (a position restored behind), none skipped (one restored ahead, or a group lost).
    assert set(counts) == set(training) and sorted(counts.values()) == [1] * (40 - position) + [2] * position
    final = read_rows(second / "metrics.csv")[-1]
    assert final["rollout/dropped"] == 0 and final["rollout/epochs"] == pytest.approx(1 + position / 40, abs=0.2)
