"""The two references that need no extra state: none, and async recompute."""

from __future__ import annotations

import lightning as L
import torch


class NoReference:
    """No training-side reference: losses use mu_old (plain PPO-clip on pi_theta / mu_old)."""

    exact = False

    def callbacks(self) -> list[L.Callback]:
        return []

    def ref_logprobs(self, module: L.LightningModule, batch: dict, current_logprobs: torch.Tensor) -> None:
        return None


class AsyncRecomputeReference:
    """pi_async: the trainer's current weights, scored before the update (a proxy for pi_old).

    With one optimizer step per batch this is pi_theta detached, so r_s = 1 for every token: the
    staleness clip is a no-op and r_d absorbs all staleness (the paper's "decoupled PPO & async").
    The forward is not run twice: before the step, the current weights' log-probs are the ones
    just computed for the loss.
    """

    exact = False

    def callbacks(self) -> list[L.Callback]:
        return []

    def ref_logprobs(self, module: L.LightningModule, batch: dict, current_logprobs: torch.Tensor) -> torch.Tensor:
        return current_logprobs.detach()
