"""Exact pi_old that arrives with the batch: interruption-sync and the dedicated old-logit model."""

from __future__ import annotations

import lightning as L
import torch
from asyncrl_callbacks import InterruptionSync


class InterruptSyncReference:
    """pi_old scored before each version disappears (`asyncrl_callbacks.InterruptionSync`).

    Needs `data.weight_sync_every=1`: the engine's version must be the trainer's weights at every
    optimizer step, or tokens of a version would be sampled after its weights are gone.
    A token that could not be scored under its own version carries NaN, which the loss masks
    and counts (`train/nonfinite_tokens`).
    """

    exact = True

    def __init__(self) -> None:  # noqa: D107
        self.interruption = InterruptionSync()

    def callbacks(self) -> list[L.Callback]:
        return [self.interruption]

    def ref_logprobs(self, module: L.LightningModule, batch: dict, current_logprobs: torch.Tensor) -> torch.Tensor:
        if module.trainer.datamodule.weight_sync_every != 1:
            raise ValueError("model.reference='interrupt_sync' needs data.weight_sync_every=1")
        # Tokens of the version being trained were sampled after the last interruption; their
        # version's weights are the live ones, so pi_old is exactly the current log-prob.
        old_logprobs = batch["old_logprobs"]
        of_current_version = batch["versions"] == module.global_step
        return torch.where(torch.isnan(old_logprobs) & of_current_version, current_logprobs.detach(), old_logprobs)


class _RequestDedicatedWorker(L.Callback):
    """Asks the rollout side for the dedicated old-logit worker before rollouts start."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        trainer.datamodule.use_dedicated_old_logit_model()


class DedicatedReference:
    """pi_old from a dedicated old-logit model: a worker process that holds the engine's version.

    It scores finished groups before they enter the buffer and, at each weight push, the partial
    turns of the outgoing version, overlapping with training. A token it could not score under its
    own version carries NaN, which the loss masks and counts (`train/nonfinite_tokens`).
    """

    exact = True

    def callbacks(self) -> list[L.Callback]:
        return [_RequestDedicatedWorker()]

    def ref_logprobs(self, module: L.LightningModule, batch: dict, current_logprobs: torch.Tensor) -> torch.Tensor:
        return batch["old_logprobs"]
