"""GPPO: gradient-preserving clipping policy optimisation (Klear-Reasoner, Su et al., 2025)."""

from __future__ import annotations

import torch

from lit_asyncrl.losses.base import ClippedLossStrategy, TokenTerms
from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import ratio, trust_region_mask, unit_with_gradient
from lit_asyncrl.losses.registry import register_loss


@register_loss("gppo")
class GPPO(ClippedLossStrategy):
    """``min(r A, clip(r, low/sg(r) r, high/sg(r) r) A)``, ``r = pi_theta / pi_ref``.

    Same values as PPO-clip, but a clipped token keeps a bounded gradient: ``high * A * grad log pi``
    when ``A >= 0, r > high`` and ``low * A * grad log pi`` when ``A < 0, r < low``; elsewhere
    ``r A grad log pi``. Implemented as ``sg(c) A exp(log pi - sg(log pi))`` with ``c`` that
    coefficient. ``clip_mask`` is the PPO trust region (False = the clipped, bounded-gradient case).
    ``r`` uses ``mu_old`` when no reference is given.

    Args:
        clip_bounds: ``(low, high)`` ratio bounds of the trust region.
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    reference_use = "optional"

    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        low, high = self.clip_bounds
        policy_ratio = ratio(inputs.logprobs.detach(), inputs.anchor_logprobs)  # [B, T]
        inside = trust_region_mask(policy_ratio, inputs.advantages, self.clip_bounds)  # [B, T]
        # [B, T]: the bound that clipped it; masked_fill keeps the compute dtype (float64 stays exact)
        bound = torch.full_like(policy_ratio, low).masked_fill_(inputs.advantages >= 0, high)
        coefficient = torch.where(inside, policy_ratio, bound)  # [B, T], no gradient
        objective = coefficient * inputs.advantages * unit_with_gradient(inputs.logprobs)
        return TokenTerms(objective=objective, discrepancy_mask=None, clip_mask=inside)
