"""The symmetric train-infer correction on ``r_d``, shared by the decoupled strategies."""

from __future__ import annotations

from torch import Tensor

from lit_asyncrl.losses.ratios import in_bounds, ratio


def masked_discrepancy_weight(
    log_reference: Tensor, behavior_logprobs: Tensor, bounds: tuple[float, float]
) -> tuple[Tensor, Tensor]:
    """``r_d = pi_ref / mu_old`` as a stop-gradient weight, and its mask ``M_[low, high](r_d)`` (Table 1).

    Args:
        log_reference: ``log pi_ref`` (or ``log pi_prox``), detached ``[B, T]``.
        behavior_logprobs: ``log mu_old`` ``[B, T]``.
        bounds: ``(low, high)``; the mask is symmetric: the token is dropped on either side.

    Returns:
        weight ``[B, T]`` (no gradient) and bool mask ``[B, T]``.
    """
    discrepancy_ratio = ratio(log_reference.detach(), behavior_logprobs)  # [B, T]
    return discrepancy_ratio, in_bounds(discrepancy_ratio, bounds)
