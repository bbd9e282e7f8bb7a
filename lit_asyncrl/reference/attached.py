"""Exact pi_old that arrives with the batch: interruption-sync and the dedicated old-logit model."""

from __future__ import annotations

import lightning as L
import torch
from asyncrl_callbacks import InterruptionSync
from typing_extensions import override

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.reference.base import ReferenceSource
from lit_asyncrl.trainer_callbacks.find import rollouts_of


class InterruptSyncReference(ReferenceSource):
    """pi_old scored before each version disappears (`asyncrl_callbacks.InterruptionSync`).

    Needs `rollout.weight_sync_every=1` (checked when the fit starts): the engine's version must be
    the trainer's weights at every optimizer step, or tokens of a version would be sampled after
    its weights are gone. A token that could not be scored under its own version carries NaN,
    which the loss masks and counts (`train/nonfinite_tokens`).
    """

    exact = True

    def __init__(self) -> None:
        self._interruption = InterruptionSync(module_attr="policy")
        self._check = _RequireSyncEveryStep(self._interruption)

    def callbacks(self) -> list[L.Callback]:
        return [self._check, self._interruption]

    def ref_logprobs(self, batch: dict, current_logprobs: torch.Tensor, version: int) -> torch.Tensor:
        # Tokens of the version being trained were sampled after the last interruption; their
        # version's weights are the live ones, so pi_old is exactly the current log-prob.
        old_logprobs = batch["old_logprobs"]
        of_current_version = batch["versions"] == version
        return torch.where(torch.isnan(old_logprobs) & of_current_version, current_logprobs.detach(), old_logprobs)


class _RequireSyncEveryStep(L.Callback):
    def __init__(self, interruption: InterruptionSync) -> None:
        self.interruption = interruption

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        rollouts = rollouts_of(trainer, "reference=interrupt_sync")
        if rollouts.weight_sync_every != 1:
            raise ValueError(
                f"reference=interrupt_sync needs {config_key('rollout.weight_sync_every')}=1, got {rollouts.weight_sync_every}"
            )
        self.interruption.rollouts = rollouts


class DedicatedReference(ReferenceSource):
    """pi_old from a dedicated old-logit model: a worker process that holds the engine's version.

    It scores finished groups before they enter the buffer and, at each weight push, the partial
    turns of the outgoing version, overlapping with training. A token it could not score under its
    own version carries NaN, which the loss masks and counts (`train/nonfinite_tokens`).
    """

    exact = True

    def callbacks(self) -> list[L.Callback]:
        return [_RequestDedicatedWorker()]

    def ref_logprobs(self, batch: dict, current_logprobs: torch.Tensor, version: int) -> torch.Tensor:
        return batch["old_logprobs"]


class _RequestDedicatedWorker(L.Callback):
    """Asks the rollout service for the dedicated old-logit worker before rollouts start."""

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        rollouts_of(trainer, "reference=dedicated").use_old_logit_worker()
