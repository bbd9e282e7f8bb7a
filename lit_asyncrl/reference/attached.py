"""Exact pi_old that arrives with the batch: interruption-sync and the dedicated old-logit model."""

from __future__ import annotations

import lightning as L
import torch
from asyncrl_callbacks import InterruptSync

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.reference.base import ReferenceSource
from lit_asyncrl.rollout.service import DedicatedWorkerHost, RolloutService, require_service


class InterruptSyncReference(ReferenceSource):
    """pi_old scored before each version disappears (`asyncrl_callbacks.InterruptSync`).

    Needs `rollout.weight_sync_every=1` (checked when the fit starts): the engine's version must be
    the trainer's weights at every optimizer step, or tokens of a version would be sampled after
    its weights are gone. A token that could not be scored under its own version carries NaN,
    which the loss masks and counts (`train/nonfinite_tokens`).
    """

    exact = True
    scores_in_the_step = False

    def __init__(self) -> None:
        # It finds the datamodule's rollout service itself, at its own set-up.
        self._interruption = InterruptSync(module_attr="policy")

    def callbacks(self) -> list[L.Callback]:
        return [self._interruption]

    def bind(self, rollouts: RolloutService | None) -> None:
        rollouts = require_service(rollouts, "reference=interrupt_sync")
        if rollouts.weight_sync_every != 1:
            raise ValueError(
                f"reference=interrupt_sync needs {config_key('rollout.weight_sync_every')}=1, "
                f"got {rollouts.weight_sync_every}"
            )

    def ref_logprobs(self, batch: dict, current_logprobs: torch.Tensor, version: int) -> torch.Tensor:
        # Tokens of the version being trained were sampled after the last interruption; their
        # version's weights are the live ones, so pi_old is exactly the current log-prob, which the
        # module gives with dropout off (`live_logprobs_without_dropout`).
        old_logprobs = batch["old_logprobs"]
        of_current_version = batch["versions"] == version
        return torch.where(torch.isnan(old_logprobs) & of_current_version, current_logprobs.detach(), old_logprobs)


class DedicatedReference(ReferenceSource):
    """pi_old from a dedicated old-logit model: a worker process that holds the engine's version.

    It scores finished groups before they enter the buffer and, at each weight push, the partial
    turns of the outgoing version, overlapping with training. A token it could not score under its
    own version carries NaN, which the loss masks and counts (`train/nonfinite_tokens`). Needs a
    rollout service that can host the worker (`DedicatedWorkerHost`).
    """

    exact = True
    scores_in_the_step = False

    def bind(self, rollouts: RolloutService | None) -> None:
        rollouts = require_service(rollouts, "reference=dedicated")
        if not isinstance(rollouts, DedicatedWorkerHost):
            raise TypeError(
                f"reference=dedicated needs a rollout service that hosts an old-logit worker (`use_dedicated_worker`); "
                f"{type(rollouts).__name__} does not"
            )
        rollouts.use_dedicated_worker()

    def check_rollout_settings(self, rollouts: RolloutService) -> None:
        # The service records the worker now and refuses what it cannot host (several engines).
        self.bind(rollouts)

    def ref_logprobs(self, batch: dict, current_logprobs: torch.Tensor, version: int) -> torch.Tensor:
        return batch["old_logprobs"]
