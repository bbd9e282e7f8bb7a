"""`TrainedEpisodesWriter`: each trained batch's episodes as JSON lines, cut to their own lengths."""

import json
from types import SimpleNamespace

import torch

from lit_asyncrl.rollout.records import Trajectory, training_batch
from lit_asyncrl.trainer_callbacks import TrainedEpisodesWriter


def trajectory(
    group_id: int, prompt: list[int], sampled: list[int], mu: list[float], versions: list[int], reward: float
) -> Trajectory:
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
    writer, trainer = (
        TrainedEpisodesWriter(tmp_path / "trained_episodes"),
        SimpleNamespace(global_step=12, global_rank=0, world_size=1),
    )
    writer.on_train_batch_start(trainer, None, None, 0)  # a module that pulls its own batch: none yet
    trainer.global_step = 13  # the optimizer step taken: the file keeps the step the batch was trained at
    writer.on_train_batch_end(trainer, None, torch.tensor(0.0), batch, 0)

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
    writer.on_train_batch_end(trainer, None, torch.tensor(0.0), batch, 0)
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


def test_the_micro_batches_of_one_step_share_its_file_and_a_rewritten_step_starts_it_anew(tmp_path):
    first, second = (training_batch([trajectory(g, [1], [2], [-1.0], [0], 0.0)], 0, (), 1.0, -1) for g in (1, 2))
    writer, trainer = TrainedEpisodesWriter(tmp_path), SimpleNamespace(global_step=5, global_rank=0, world_size=1)
    for batch in (first, second):  # gradient accumulation: two batches, one optimizer step
        writer.on_train_batch_start(trainer, None, batch, 0)
        writer.on_train_batch_end(trainer, None, torch.tensor(0.0), batch, 0)
    assert [json.loads(line)["group_id"] for line in (tmp_path / "step=5.jsonl").read_text().splitlines()] == [1, 2]
    resumed = TrainedEpisodesWriter(tmp_path)  # a resumed run trains step 5 again: its file is replaced
    resumed.on_train_batch_start(trainer, None, second, 0)
    resumed.on_train_batch_end(trainer, None, torch.tensor(0.0), second, 0)
    assert [json.loads(line)["group_id"] for line in (tmp_path / "step=5.jsonl").read_text().splitlines()] == [2]


def test_a_lightning_fit_that_pulls_its_batch_in_the_step_writes_every_steps_batch(tmp_path):
    # As AsyncRLModule does: `training_step(dataloader_iter)`; Lightning gives the end hook the batch.
    import lightning as L
    from torch.utils.data import DataLoader, IterableDataset

    class Batches(IterableDataset):
        def __iter__(self):
            for group in range(3):
                yield training_batch([trajectory(group, [1], [2], [-1.0], [0], 0.0)], 0, (), 1.0, -1)

    class PullsItsBatch(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(()))

        def training_step(self, dataloader_iter):
            batch, _, _ = next(dataloader_iter)
            return (self.weight - batch["rewards"].sum()) ** 2

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    writer = TrainedEpisodesWriter(tmp_path / "episodes")
    trainer = L.Trainer(
        max_steps=3, callbacks=[writer], logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, accelerator="cpu",
    )  # fmt: skip
    trainer.fit(PullsItsBatch(), DataLoader(Batches(), batch_size=None))
    written = {path.name: json.loads(path.read_text())["group_id"] for path in (tmp_path / "episodes").iterdir()}
    assert written == {"step=0.jsonl": 0, "step=1.jsonl": 1, "step=2.jsonl": 2}
