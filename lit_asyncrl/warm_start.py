"""A short supervised warm start on scripted demonstrations: its own Lightning fit, before RL.

Tiny random policies first have to discover the answer format; a few supervised steps on the
environment's scripted plays (`Environment.demonstration`) skip that phase. The warm start is a
separate `Trainer.fit` (Lightning's optimizer handling, precision, logging and progress bar) on the
policy object the RL module trains, so the RL fit starts from the warmed-up weights at version 0
and its callbacks (weight push, EWMA, snapshots) never see the supervised steps.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lit_asyncrl.envs.base import Environment, call_blocking
from lit_asyncrl.progress_bar import stream_progress_bar
from lit_asyncrl.rollout.episodes.for_task import episode_formats_for
from lit_asyncrl.rollout.episodes.formats import EpisodeFormat
from lit_asyncrl.rollout.records import Trajectory, collate
from lit_asyncrl.rollout.serving.instances import training_instance
from lit_asyncrl.scoring import token_logprobs
from lit_asyncrl.text import pad_token_id


def demonstration_trajectories(
    env: Environment, episode_formats: Mapping[str | None, EpisodeFormat], num_episodes: int, rng: random.Random
) -> list[Trajectory]:
    """Scripted plays as trajectories, in the format the engine's episodes have (raw text or the
    chat template; a mixture's tasks each in their own): demonstrated agent turns are the policy tokens."""
    trajectories = []
    for _ in range(num_episodes):
        task = env.task_of(training_instance(env, rng))
        episode_format = episode_formats[task.name]
        trajectory = Trajectory(group_id=-1, task=task.name)
        episode_format.open(trajectory, call_blocking(task.env.new_episode(task.instance).reset, rng.getrandbits(31)))
        demonstration = list(task.env.demonstration(task.instance))
        for turn, (action, observation) in enumerate(demonstration):
            action_ids = episode_format.demonstrated_turn_ids(action)
            trajectory.extend_policy(action_ids, [0.0] * len(action_ids), [0] * len(action_ids))
            if turn + 1 < len(demonstration):  # an episode's last answer is never shown to the agent
                episode_format.add_observation(trajectory, observation)
        trajectories.append(trajectory)
    return trajectories


class DemonstrationStream(IterableDataset):
    """Endless collated batches of scripted plays, drawn from `seed`."""

    def __init__(self, env: Environment, tokenizer: Any, batch_size: int, seed: int) -> None:
        self.env = env
        self.batch_size = batch_size
        self.seed = seed
        self.episode_formats = episode_formats_for(tokenizer, env)
        self.pad_id = pad_token_id(tokenizer)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        rng = random.Random(self.seed)
        while True:
            yield collate(
                demonstration_trajectories(self.env, self.episode_formats, self.batch_size, rng), pad_id=self.pad_id
            )


class SupervisedWarmStart(L.LightningModule):
    """Minimises the NLL of demonstrated agent tokens with Adam; trains `policy` in place."""

    def __init__(self, policy: torch.nn.Module, lr: float) -> None:
        super().__init__()
        self.policy = policy
        self.lr = lr

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.policy.parameters(), lr=self.lr)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        mask = batch["loss_mask"]
        logprobs = token_logprobs(self.policy, batch["input_ids"], batch["attention_mask"], temperature=1.0)
        loss = -(logprobs * mask).sum() / mask.sum()
        self.log("warm_start/nll", loss, prog_bar=True, batch_size=mask.shape[0])
        return loss


class WarmStart:
    """The warm-start phase as config: `steps` supervised steps (0 = none) at `lr`.

    Args:
        steps: optimizer steps; 0 skips the phase.
        lr: Adam learning rate.
        batch_size: demonstrations per step.
        seed: demonstrations are drawn from this seed.
    """

    def __init__(self, steps: int = 0, lr: float = 1e-3, batch_size: int = 64, seed: int = 0) -> None:
        if steps < 0:
            raise ValueError(f"warm_start.steps must be >= 0, got {steps}")
        if lr <= 0:
            raise ValueError(f"warm_start.lr must be > 0, got {lr}")
        if batch_size < 1:
            raise ValueError(f"warm_start.batch_size must be >= 1, got {batch_size}")
        self.steps = steps
        self.lr = lr
        self.batch_size = batch_size
        self.seed = seed

    def run(
        self,
        policy: torch.nn.Module,
        env: Environment,
        tokenizer: Any,
        *,
        log_dir: str | None = None,
        **trainer_kwargs: Any,
    ) -> float | None:
        """Fit `policy` on `env`'s demonstrations; returns the last NLL (None when skipped).

        `log_dir`: where the phase's `metrics.csv` goes (None = no logger). `trainer_kwargs` pass
        through to its `Trainer` (accelerator, devices, precision).
        """
        if self.steps == 0:
            return None
        logger = L.pytorch.loggers.CSVLogger(log_dir, name="warm_start", version="") if log_dir is not None else False
        trainer = L.Trainer(
            max_steps=self.steps,
            max_epochs=-1,
            logger=logger,
            log_every_n_steps=1,
            enable_checkpointing=False,
            enable_model_summary=False,
            callbacks=stream_progress_bar("Warm start", enabled=trainer_kwargs.get("enable_progress_bar", True)),
            **trainer_kwargs,
        )
        loader = DataLoader(
            DemonstrationStream(env, tokenizer, self.batch_size, self.seed), batch_size=None, num_workers=0
        )
        was_training = policy.training
        trainer.fit(SupervisedWarmStart(policy, self.lr), train_dataloaders=loader)
        policy.train(was_training)
        return float(trainer.callback_metrics["warm_start/nll"])


def load_tokenizer(model_path: str) -> Any:
    """The tokenizer of a local Hugging Face model folder (the one the engine serves)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)
