"""A KL penalty to the frozen initial policy (TRL's `beta`, verl's `use_kl_loss`): `model.kl_coef`
times an estimate of KL(pi_theta || pi_init) over the step's policy tokens, added to the loss.

pi_init is the model as loaded from `model.path` (before any warm start; dropout off), kept once for
the whole run, not per version. With a LoRA adapter it is the base model with the adapter switched
off, so nothing is copied; otherwise a frozen copy is loaded from the folder at the first step (one
more model in memory; under FSDP a whole copy on each process). Its log-probs use the step's sampling
settings, as pi_theta's do. A resumed run reloads the same pi_init from the folder.

Per token, with x = log pi_init - log pi_theta on tokens sampled from (about) pi_theta:
- `k1` = -x, unbiased, negative on some tokens;
- `k3` = exp(x) - x - 1, unbiased and never negative (Schulman's estimator; TRL's GRPO default).
"""

from __future__ import annotations

import torch
from asyncrl_callbacks.eval_mode import evaluation_mode

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.models.policy import load_policy
from lit_asyncrl.scoring import token_logprobs

ESTIMATORS = ("k1", "k3")


def per_token_kl(logprobs: torch.Tensor, initial_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """[B, T] estimate of KL(pi_theta || pi_init) at each token (see the module's docstring)."""
    x = initial_logprobs - logprobs
    if estimator == "k1":
        return -x
    return torch.exp(x) - x - 1


class KLPenalty:
    """The penalty term and pi_init's log-probs.

    Args:
        coef: weight of the term in the loss (> 0; a run without the penalty has none).
        estimator: "k1" or "k3".
        model_path: the folder pi_init is loaded from (the policy's own `model.path`, resolved).
    """

    def __init__(self, coef: float, estimator: str, model_path: str) -> None:
        if estimator not in ESTIMATORS:
            raise ValueError(
                f"{config_key('model.kl_estimator')} must be one of {', '.join(ESTIMATORS)}, got {estimator!r}"
            )
        if not coef > 0:
            raise ValueError(f"{config_key('model.kl_coef')} must be >= 0 (0 = no KL penalty), got {coef}")
        self.coef = coef
        self.estimator = estimator
        self.model_path = model_path
        # Not a submodule of the LightningModule: neither trained nor saved in checkpoints.
        self._initial: torch.nn.Module | None = None

    def initial_logprobs(self, policy: torch.nn.Module, batch: dict) -> torch.Tensor:
        """[B, T] pi_init's log-probs of the batch's tokens, without gradients."""
        arguments = (batch["input_ids"], batch["attention_mask"], batch["temperature"], batch["top_k"])
        with torch.no_grad():
            if hasattr(policy, "disable_adapter"):  # peft: the base model is pi_init
                with policy.disable_adapter(), evaluation_mode(policy):
                    return token_logprobs(policy, *arguments)
            if self._initial is None:
                self._initial = load_policy(self.model_path).to(batch["input_ids"].device).eval()
                self._initial.requires_grad_(False)
            return token_logprobs(self._initial, *arguments)

    def loss(self, policy: torch.nn.Module, batch: dict, logprobs: torch.Tensor) -> tuple[torch.Tensor, float]:
        """`coef` times the mean per-token KL over the batch's policy tokens (with gradient), and that mean."""
        mask = batch["loss_mask"]
        kl = per_token_kl(logprobs, self.initial_logprobs(policy, batch), self.estimator)  # [B, T]
        mean = (kl * mask).sum() / mask.sum().clamp(min=1)
        return self.coef * mean, float(mean.detach())
