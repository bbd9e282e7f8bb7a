"""Interruption-sync: score every token of version v with the still-resident weights, before the
optimizer step replaces them (paper section 5.1, "synchronization via partial rollout interruption").

No weights are stored: before the step that turns version v into v+1, generation is paused and
every token sampled under v that has no pi_old yet, in finished or partial episodes, is scored by
the live module. The price is a stall per step, which this callback measures.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import lightning.pytorch as pl
import torch
from asyncrl_callbacks.eval_mode import evaluation_mode
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

#: ``score_fn(input_ids [b, T], attention_mask [b, T]) -> logits [b, T, V]`` of the live weights.
ScoreFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@runtime_checkable
class InterruptibleRollouts(Protocol):
    """What the rollout side must offer (in lit_asyncrl, every ``RolloutService``)."""

    def pause(self) -> None:
        """Stop sampling new tokens, keeping in-flight episodes (they resume later)."""

    def score_unscored(self, score_fn: ScoreFn, version: int) -> int:
        """Score, with ``score_fn``, every token of ``version`` lacking pi_old; return how many."""

    def resume(self) -> None:
        """Let generation continue (a weight push may already have done so)."""


class InterruptSync(Callback):
    """Pause rollouts and score their unscored tokens right before each optimizer step.

    The weight push that follows the step (v+1) is expected to resume generation;
    ``on_train_batch_end`` resumes it in any case, so place this callback after the one that pushes
    weights. If scoring raises, generation is resumed before the error propagates.

    Example::

        trainer = Trainer(callbacks=[MyWeightPush(), InterruptSync(rollouts=my_rollouts, module_attr="policy")])

    Args:
        rollouts: an ``InterruptibleRollouts``; None = the trainer's datamodule's ``rollouts``
            attribute, or the datamodule itself when it has none.
        module_attr: Dotted attribute of the LightningModule holding the scoring module (a Hugging
            Face causal LM, or any module returning logits or an output with ``.logits``); None =
            the LightningModule itself.
        log_prefix: prefix of the logged metrics (``interrupt_sync/stall_s``, ``interrupt_sync/scored_tokens``).
    """

    def __init__(
        self,
        rollouts: InterruptibleRollouts | None = None,
        module_attr: str | None = None,
        log_prefix: str = "interrupt_sync/",
    ) -> None:
        self.rollouts = rollouts
        self.module_attr = module_attr
        self.log_prefix = log_prefix
        self.last_stall_s = 0.0
        self.last_scored_tokens = 0
        self.total_stall_s = 0.0

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.rollouts is None:
            datamodule = trainer.datamodule
            self.rollouts = getattr(datamodule, "rollouts", datamodule)
        if not isinstance(self.rollouts, InterruptibleRollouts):
            raise TypeError(f"InterruptSync needs pause/score_unscored/resume on {type(self.rollouts).__name__}")

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        module = (
            pl_module if self.module_attr is None else functools.reduce(getattr, self.module_attr.split("."), pl_module)
        )
        device = next(module.parameters()).device

        def score_fn(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            output = module(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device))
            return getattr(output, "logits", output)

        start = time.perf_counter()
        self.rollouts.pause()
        try:
            # Eval mode: pi_old is the policy itself, not a sample of it under dropout.
            with torch.no_grad(), evaluation_mode(module):
                self.last_scored_tokens = self.rollouts.score_unscored(score_fn, trainer.global_step)
        except BaseException:
            self.rollouts.resume()  # never leave generation paused behind an error
            raise
        self.last_stall_s = time.perf_counter() - start
        self.total_stall_s += self.last_stall_s

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.rollouts.resume()
        pl_module.log(f"{self.log_prefix}stall_s", self.last_stall_s, batch_size=1)
        pl_module.log(f"{self.log_prefix}scored_tokens", float(self.last_scored_tokens), batch_size=1)
