"""M2PO: second-moment trust region (Zheng et al., 2025, "Prosperity before Collapse: How Far Can
Off-Policy RL Reach with Stale Data on LLMs?"; AReaL)."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_asyncrl.losses.arguments import check_positive
from lit_asyncrl.losses.base import Aggregation, LossStrategy, TokenTerms
from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import LOG_RATIO_LIMIT, ratio
from lit_asyncrl.losses.registry import register_loss


def second_moment_mask(log_ratio: Tensor, valid: Tensor, second_moment_bound: float) -> Tensor:
    """Keep the largest token set with ``M2 = mean (log r)^2 <= bound``, dropping the largest ``(log r)^2``.

    M2PO removes the token with the largest ``(log r)^2`` until the batch ``M2`` is within the bound.
    Sorted ascending, the prefix means of ``(log r)^2`` never decrease, so the kept set is the longest
    prefix whose mean is within the bound: one sort and one cumulative sum, no loop.

    Args:
        log_ratio: ``log r`` ``[B, T]``, detached.
        valid: bool ``[B, T]``.
        second_moment_bound: ``tau_M2``.

    Returns:
        bool ``[B, T]``, True on kept tokens.
    """
    squared = torch.where(valid, log_ratio.to(torch.float64).square(), torch.inf).reshape(-1)  # [B*T]
    sorted_squared, order = torch.sort(squared)
    positions = torch.arange(1, squared.numel() + 1, device=squared.device, dtype=torch.float64)
    prefix_mean = torch.cumsum(sorted_squared, dim=0) / positions  # inf past the last valid token
    kept_count = (prefix_mean <= second_moment_bound).sum()
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return (rank < kept_count).reshape(valid.shape) & valid


@register_loss("m2po")
class M2PO(LossStrategy):
    """``M_M2 * r A`` with ``r = pi_theta / pi_ref`` (``mu_old`` without a reference), no clipping.

    The mask ``M_M2`` (:func:`second_moment_mask`) replaces PPO's clip; ``clip_mask`` is that mask.

    Args:
        second_moment_bound: ``tau_M2 > 0`` on the batch mean of ``(log r)^2``; 0.04 in the paper.
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    reference_use = "optional"

    def __init__(
        self,
        *,
        second_moment_bound: float = 0.04,
        aggregation: Aggregation = "token_mean",
        normalizer: float | None = None,
    ) -> None:
        super().__init__(aggregation=aggregation, normalizer=normalizer)
        self.second_moment_bound = check_positive("second_moment_bound", second_moment_bound)

    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        log_ratio = (inputs.logprobs.detach() - inputs.anchor_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        kept = second_moment_mask(log_ratio, inputs.valid, self.second_moment_bound)  # [B, T]
        policy_ratio = ratio(inputs.logprobs, inputs.anchor_logprobs)  # [B, T]
        objective = torch.where(kept, policy_ratio * inputs.advantages, 0.0)
        return TokenTerms(objective=objective, discrepancy_mask=None, clip_mask=kept)
