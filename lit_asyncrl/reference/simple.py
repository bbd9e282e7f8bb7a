"""The two references that need no extra state: none, and async recompute."""

from __future__ import annotations

import torch

from lit_asyncrl.scoring import token_logprobs


class NoReference:
    """No training-side reference: losses use mu_old (plain PPO-clip on pi_theta / mu_old)."""

    exact = False

    def ref_logprobs(self, module: torch.nn.Module, batch: dict) -> None:
        return None


class AsyncRecomputeReference:
    """pi_async: the trainer's current weights scored before the update (a proxy for pi_old).

    With one optimizer step per batch this equals pi_theta detached, so r_s = 1 for every token:
    the staleness clip is a no-op and r_d absorbs all staleness (the paper's "decoupled PPO & async").
    """

    exact = False

    @torch.no_grad()
    def ref_logprobs(self, module: torch.nn.Module, batch: dict) -> torch.Tensor:
        return token_logprobs(module.policy, batch["input_ids"], batch["attention_mask"], batch["temperature"], batch["top_k"])
