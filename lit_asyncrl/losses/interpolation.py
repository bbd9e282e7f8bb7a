"""Proximal policies interpolated between ``mu_old`` and the detached ``pi_theta`` (paper Appendix A).

With ``alpha`` the weight of ``mu_old`` (``alpha = 1/(n+1)`` for version gap ``n``, Table 4):

- arithmetic (``linear_prox``, Table 1): ``pi_prox = alpha mu_old + (1 - alpha) pi_theta``;
- log-linear (A-3PO, Li et al. 2025): ``log pi_prox = alpha log mu_old + (1 - alpha) log pi_theta``.

``pi_theta`` enters detached: ``pi_prox`` is a reference, not a path for gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor


def interpolation_alpha(version_gap: Tensor | None, fixed_alpha: float | None, like: Tensor) -> Tensor:
    """Per-token weight of ``mu_old``: ``fixed_alpha`` if set, else ``1 / (n + 1)`` ``[B, T]``.

    A token sampled by the current weights (``n = 0``) gets ``alpha = 1``: ``pi_prox = mu_old``.
    """
    if fixed_alpha is not None:
        return torch.full_like(like, fixed_alpha)
    if version_gap is None:
        raise ValueError("interpolated proximal policies need LossInputs.version_gap, or a fixed `alpha`")
    return version_gap.to(like.dtype, copy=True).add_(1.0).reciprocal_()  # 1 / (n + 1), one [B, T] tensor


def linear_proximal_logprobs(logprobs: Tensor, behavior_logprobs: Tensor, alpha: Tensor) -> Tensor:
    """``log(alpha mu_old + (1 - alpha) pi_theta)``, in log space; ``pi_theta`` detached."""
    # logaddexp keeps precision for tiny probabilities; log(0) = -inf at alpha = 1 is handled by it.
    # the same operations as logaddexp(log(alpha) + mu, log1p(-alpha) + pi), in place on two temporaries
    log_behavior_part = torch.log(alpha).add_(behavior_logprobs)
    log_policy_part = torch.neg(alpha).log1p_().add_(logprobs.detach())
    return torch.logaddexp(log_behavior_part, log_policy_part, out=log_behavior_part)


def loglinear_proximal_logprobs(logprobs: Tensor, behavior_logprobs: Tensor, alpha: Tensor) -> Tensor:
    """``alpha log mu_old + (1 - alpha) log pi_theta``; ``pi_theta`` detached."""
    # alpha mu + (1 - alpha) pi with two temporaries; (-alpha) + 1 is exactly 1 - alpha
    policy_part = torch.neg(alpha).add_(1.0).mul_(logprobs.detach())
    return torch.mul(alpha, behavior_logprobs).add_(policy_part)
