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

    def __init__(self) -> None:
        self.interruption = InterruptionSync()

    def callbacks(self) -> list[L.Callback]:
        return [self.interruption]

    def ref_logprobs(self, module: L.LightningModule, batch: dict, current_logprobs: torch.Tensor) -> torch.Tensor:
        if module.trainer.datamodule.weight_sync_every != 1:
            raise ValueError("model.reference='interrupt_sync' needs data.weight_sync_every=1")
        return batch["old_logprobs"]
