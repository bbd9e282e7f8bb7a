"""`TrainedEpisodesWriter`: each trained batch's episodes as JSON lines, cut to their own lengths."""

import json
from types import SimpleNamespace

import torch

from lit_asyncrl.rollout.records import Trajectory, training_batch
from lit_asyncrl.trainer_callbacks import TrainedEpisodesWriter


def trajectory(group_id: int, prompt: list[int], sampled: list[int], mu: list[float], versions: list[int], reward: float) -> Trajectory:
    return Trajectory(
        token_ids=prompt + sampled,
        loss_mask=[False] * len(prompt) + [True] * len(sampled),
        behavior_logprobs=[0.0] * len(prompt) + mu,
        old_logprobs=[0.0] * (len(prompt) + len(sampled)),
        versions=[-1] * len(prompt) + versions,
        reward=reward,
        success=reward > 0,
        group_id=group_id,
    )


def test_each_episode_is_one_line_with_its_own_tokens_versions_and_mu(tmp_path):
    # Two episodes of unequal length: the shorter one is padded in the batch, not in the file.
    # mu values are exact in float32 (powers of two), so they come back unchanged.
    long = trajectory(7, [5, 6], [9, 10, 11], [-0.5, -0.25, -2.0], [3, 3, 4], 1.0)
    short = trajectory(8, [5, 6], [12], [-1.0], [4], 0.0)
    batch = training_batch([long, short], pad_id=0, task_names=(), temperature=1.0, top_k=-1)
    writer, trainer = TrainedEpisodesWriter(tmp_path / "trained_episodes"), SimpleNamespace(global_step=12, global_rank=0, world_size=1)
    writer.on_train_batch_start(trainer, None, None, 0)
    trainer.global_step = 13  # the optimizer step taken: the file keeps the step the batch was trained at
    writer.on_train_batch_end(trainer, None, {"loss": torch.tensor(0.0), "batch": batch}, None, 0)

    lines = (tmp_path / "trained_episodes" / "step=12.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {
            "step": 12, "group_id": 7, "reward": 1.0, "success": 1.0,
            "input_ids": [5, 6, 9, 10, 11], "loss_mask": [0, 0, 1, 1, 1],
            "versions": [-1, -1, 3, 3, 4], "behavior_logprobs": [0.0, 0.0, -0.5, -0.25, -2.0],
        },
        {
            "step": 12, "group_id": 8, "reward": 0.0, "success": 0.0,
            "input_ids": [5, 6, 12], "loss_mask": [0, 0, 1], "versions": [-1, -1, 4], "behavior_logprobs": [0.0, 0.0, -1.0],
        },
    ]  # fmt: skip


def test_a_mu_that_float32_rounds_comes_back_as_the_batch_holds_it(tmp_path):
    episode = trajectory(0, [1], [2], [-0.1], [0], 0.0)  # -0.1 is not exact in float32
    batch = training_batch([episode], pad_id=0, task_names=(), temperature=1.0, top_k=-1)
    writer, trainer = TrainedEpisodesWriter(tmp_path), SimpleNamespace(global_step=0, global_rank=1, world_size=2)
    writer.on_train_batch_start(trainer, None, batch, 0)
    writer.on_train_batch_end(trainer, None, torch.tensor(0.0), batch, 0)  # a module that takes its batch in the hook
    (row,) = [json.loads(line) for line in (tmp_path / "step=0.rank=1.jsonl").read_text().splitlines()]
    assert row["behavior_logprobs"][1] == torch.tensor(-0.1, dtype=torch.float32).item() != -0.1


def test_a_mixture_names_each_episodes_task_and_a_disabled_writer_writes_nothing(tmp_path):
    episode = trajectory(0, [1], [2], [-1.0], [0], 0.0)
    episode.task = "desk"
    batch = training_batch([episode], pad_id=0, task_names=("guess", "desk"), temperature=1.0, top_k=-1)
    trainer = SimpleNamespace(global_step=3, global_rank=0, world_size=1)
    for name, enabled in (("off", False), ("on", True)):
        writer = TrainedEpisodesWriter(tmp_path / name, enabled=enabled)
        writer.on_train_batch_start(trainer, None, batch, 0)
        writer.on_train_batch_end(trainer, None, torch.tensor(0.0), batch, 0)
    assert not (tmp_path / "off").exists()
    assert json.loads((tmp_path / "on" / "step=3.jsonl").read_text())["task"] == "desk"
