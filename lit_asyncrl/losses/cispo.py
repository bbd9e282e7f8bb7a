"""CISPO: clipped importance-sampling-weight policy optimisation (MiniMax-M1, 2025)."""

from __future__ import annotations

from lit_asyncrl.losses.base import ClippedLossStrategy, TokenTerms
from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import in_bounds, ratio, unit_with_gradient
from lit_asyncrl.losses.registry import register_loss


@register_loss("cispo")
class CISPO(ClippedLossStrategy):
    """``sg(clip(r, low, high)) * A * log pi_theta`` (MiniMax-M1 Eq. 4), ``r = pi_theta / pi_ref``.

    The weight is clipped, never the gradient: every token keeps ``clip(r) A grad log pi``. The value
    is written as ``sg(clip(r)) A exp(log pi - sg(log pi))`` = ``clip(r) A``, same gradient, readable
    loss. ``clip_mask`` is True where the weight was not clipped (``low <= r <= high``); gradient
    still flows on the other tokens. ``r`` uses ``mu_old`` when no reference is given.

    Args:
        clip_bounds: ``(low, high)`` bounds of the weight; MiniMax-M1 used a very small ``low``
            (effectively only an upper bound).
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    reference_use = "optional"

    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        policy_ratio = ratio(inputs.logprobs.detach(), inputs.anchor_logprobs)  # [B, T]
        weight = policy_ratio.clamp(*self.clip_bounds)  # [B, T], no gradient
        objective = weight * inputs.advantages * unit_with_gradient(inputs.logprobs)
        unclipped = in_bounds(policy_ratio, self.clip_bounds)
        return TokenTerms(objective=objective, discrepancy_mask=None, clip_mask=unclipped)
