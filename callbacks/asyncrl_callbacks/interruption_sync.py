"""Interruption-sync: score every token of version v with the still-resident weights, before the
optimizer step replaces them (paper section 5.1, "synchronization via partial rollout interruption").

No weights are stored: before the step that turns version v into v+1, generation is paused and
every token sampled under v that has no pi_old yet, in finished or partial episodes, is scored by
the live module. The price is a stall per step, which this callback measures.
"""

from __future__ import annotations

import time
from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


@runtime_checkable
class InterruptibleRollouts(Protocol):
    """What the rollout side must offer (in lit_asyncrl, the `RolloutDataModule`)."""

    def pause_rollouts(self) -> None:
        """Stop sampling new tokens, keeping in-flight episodes (they resume later)."""

    def score_unscored(self, pl_module: pl.LightningModule, version: int) -> int:
        """Score, with `pl_module`'s current weights, every token lacking pi_old; return how many."""

    def resume_rollouts(self) -> None:
        """Let generation continue (a weight push may already have done so)."""


class InterruptionSync(Callback):
    """Pause rollouts and score their unscored tokens right before each optimizer step.

    The rollouts come from `trainer.datamodule` unless `rollouts` is given. The weight push that
    follows the step (v+1) is expected to resume generation; `on_train_batch_end` resumes it in
    any case, so place this callback after the one that pushes weights.

    Example::

        trainer = Trainer(callbacks=[MyWeightPush(), InterruptionSync()])
        # the datamodule implements pause_rollouts / score_unscored / resume_rollouts

    Args:
        rollouts: an `InterruptibleRollouts`; None = the trainer's datamodule.
        log_prefix: prefix of the logged metrics (`interrupt/stall_s`, `interrupt/scored_tokens`).
    """

    def __init__(self, rollouts: InterruptibleRollouts | None = None, log_prefix: str = "interrupt/") -> None:
        self.rollouts = rollouts
        self.log_prefix = log_prefix
        self.last_stall_s = 0.0
        self.last_scored_tokens = 0
        self.total_stall_s = 0.0

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        rollouts = self._rollouts(trainer)
        start = time.perf_counter()
        rollouts.pause_rollouts()
        was_training = pl_module.training
        with torch.no_grad():
            self.last_scored_tokens = rollouts.score_unscored(pl_module, trainer.global_step)
        pl_module.train(was_training)
        self.last_stall_s = time.perf_counter() - start
        self.total_stall_s += self.last_stall_s

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._rollouts(trainer).resume_rollouts()
        pl_module.log(f"{self.log_prefix}stall_s", self.last_stall_s, batch_size=1)
        pl_module.log(f"{self.log_prefix}scored_tokens", float(self.last_scored_tokens), batch_size=1)

    def _rollouts(self, trainer: pl.Trainer) -> InterruptibleRollouts:
        rollouts = self.rollouts if self.rollouts is not None else trainer.datamodule
        if not isinstance(rollouts, InterruptibleRollouts):
            raise TypeError(f"InterruptionSync needs pause_rollouts/score_unscored/resume_rollouts on {type(rollouts).__name__}")
        return rollouts
