"""Dual-clip PPO (Ye et al., 2020, "Mastering Complex Control in MOBA Games with Deep RL")."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lit_asyncrl.losses.arguments import check_greater_than_one
from lit_asyncrl.losses.base import Aggregation, ClippedLossStrategy, TokenTerms
from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import clipped_surrogate, ratio
from lit_asyncrl.losses.registry import register_loss


@register_loss("dual_clip")
class DualClipPPO(ClippedLossStrategy):
    """PPO-clip plus a floor for negative advantages: ``max(min(r A, clip(r) A), c A)`` when ``A < 0``.

    ``r = pi_theta / pi_ref`` (``mu_old`` without a reference). For ``A < 0`` a token passes gradient
    only while ``low <= r <= c``: the floor stops a huge ``r`` from driving an unbounded update.

    Args:
        clip_bounds: ``(low, high)`` ratio bounds of the trust region.
        dual_clip_bound: ``c > 1``, the ratio above which a negative-advantage token is clipped.
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    reference_use = "optional"

    def __init__(
        self,
        *,
        clip_bounds: Sequence[float] = (0.8, 1.2),
        dual_clip_bound: float = 3.0,
        aggregation: Aggregation = "token_mean",
        normalizer: float | None = None,
    ) -> None:
        super().__init__(clip_bounds=clip_bounds, aggregation=aggregation, normalizer=normalizer)
        self.dual_clip_bound = check_greater_than_one("dual_clip_bound", dual_clip_bound)

    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        policy_ratio = ratio(inputs.logprobs, inputs.anchor_logprobs)  # [B, T]
        surrogate, inside = clipped_surrogate(policy_ratio, inputs.advantages, self.clip_bounds)
        floored = (inputs.advantages < 0) & (policy_ratio.detach() > self.dual_clip_bound)  # [B, T]
        objective = torch.where(floored, self.dual_clip_bound * inputs.advantages, surrogate)
        return TokenTerms(objective=objective, discrepancy_mask=None, clip_mask=inside & ~floored)
