"""Importance ratios and the PPO clipped surrogate, shared by every strategy."""

from __future__ import annotations

import torch
from torch import Tensor

# exp(20) ~ 4.9e8. Beyond this a log-ratio is numerically meaningless for a token-level weight, and
# exp() of an unbounded log-ratio overflows float32 at 88.7, which turns 0 * inf into NaN gradients
# even on tokens the loss does not select. Tokens past the limit get no gradient through the ratio.
LOG_RATIO_LIMIT = 20.0


def ratio(log_numerator: Tensor, log_denominator: Tensor) -> Tensor:
    """``exp(log_numerator - log_denominator)`` with the log-ratio clamped to ``+-LOG_RATIO_LIMIT``."""
    log_ratio = log_numerator - log_denominator
    if log_ratio.requires_grad:  # exp_ in place on clamp's fresh output: its backward keeps what it needs
        return log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).exp_()
    return log_ratio.clamp_(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).exp_()  # a weight: one [B, T] tensor, no copies


def unit_with_gradient(logprobs: Tensor) -> Tensor:
    """A tensor equal to 1 whose gradient is ``d log pi_theta``: ``exp(log pi - sg(log pi))``.

    Multiplying a detached coefficient ``c`` by it gives a term of value ``c`` and gradient
    ``c * grad log pi``; this is how CISPO, GPPO and GSPO-token attach a fixed weight to the score.
    """
    return torch.exp(logprobs - logprobs.detach())


def trust_region_mask(ratio_value: Tensor, advantages: Tensor, bounds: tuple[float, float]) -> Tensor:
    """MIS staleness indicator of Table 1: ``1{A>=0} 1{r_s<=high} + 1{A<0} 1{r_s>=low}``.

    True exactly where ``min(r A, clip(r, low, high) A)`` selects the unclipped term ``r A``, i.e.
    where the PPO term passes gradient. ``A = 0`` counts as positive, as in the paper.
    """
    low, high = bounds
    positive = advantages >= 0
    below_high = ratio_value <= high
    above_low = ratio_value >= low
    # bool algebra rather than torch.where on bool tensors, which is not vectorised on CPU (~10x
    # slower); in place on the fresh comparisons unless the shapes broadcast
    if below_high.shape == positive.shape:
        return below_high.logical_and_(positive).logical_or_(above_low.logical_and_(positive.logical_not_()))
    return (below_high & positive) | (above_low & ~positive)


def clipped_surrogate(ratio_value: Tensor, advantages: Tensor, bounds: tuple[float, float]) -> tuple[Tensor, Tensor]:
    """PPO-clip surrogate ``min(r A, clip(r, low, high) A)`` (paper Eq. 3, Sec. 3.1) per token.

    Written as ``where(inside, r A, sg(clip(r)) A)``, which has the same value as the ``min`` form and
    makes the gradient exactly the trust-region indicator (no half-gradient at ties).

    Returns:
        objective ``[B, T]`` (to maximise) and the bool trust-region mask ``[B, T]``.
    """
    low, high = bounds
    detached = ratio_value.detach()
    inside = trust_region_mask(detached, advantages, bounds)  # [B, T]
    # where(inside, r, sg(clip(r))) * A: the same products as where(inside, r A, sg(clip(r)) A), one
    # multiplication fewer
    return torch.where(inside, ratio_value, detached.clamp(low, high)) * advantages, inside


def in_bounds(value: Tensor, bounds: tuple[float, float]) -> Tensor:
    """Symmetric mask ``M_[low, high](value)`` (Table 1): True where ``low <= value <= high``."""
    low, high = bounds
    return (value >= low) & (value <= high)
