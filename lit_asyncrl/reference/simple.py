"""The two references that need no extra state: none, and async recompute."""

from __future__ import annotations

import torch

from lit_asyncrl.reference.base import ReferenceSource


class NoReference(ReferenceSource):
    """No training-side reference: losses use mu_old (plain PPO-clip on pi_theta / mu_old)."""

    def ref_logprobs(self, batch: dict, current_logprobs: torch.Tensor, version: int) -> None:
        return None


class AsyncRecomputeReference(ReferenceSource):
    """pi_async: the trainer's current weights, scored before the update (a proxy for pi_old).

    With one optimizer step per batch this is pi_theta detached, so r_s = 1 for every token: the
    staleness clip is a no-op and r_d absorbs all staleness (the paper's "decoupled PPO & async").
    The forward is not run twice: before the step, the current weights' log-probs are the ones
    just computed for the loss.
    """

    def ref_logprobs(self, batch: dict, current_logprobs: torch.Tensor, version: int) -> torch.Tensor:
        return current_logprobs.detach()
