"""IcePop: token-level masked importance sampling on ``r_d`` (Ling Team, 2025, Ring-1T report)."""

from __future__ import annotations

from collections.abc import Sequence

from lit_asyncrl.losses.arguments import check_bounds
from lit_asyncrl.losses.base import Aggregation, LossStrategy, TokenTerms
from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import clipped_surrogate, in_bounds, ratio
from lit_asyncrl.losses.registry import register_loss


@register_loss("icepop")
class IcePop(LossStrategy):
    """``M_[low, high](r_d) * min(r_s A, clip(r_s) A)``, ``r_d = pi_ref/mu_old``, ``r_s = pi_theta/pi_ref``.

    Differs from :class:`~lit_asyncrl.losses.decoupled.DecoupledPPO` only in dropping the ``sg(r_d)``
    weight: kept tokens are not re-weighted (IcePop's double-sided masking). Needs ``ref_logprobs``.

    Args:
        discrepancy_bounds: ``(low, high)`` of the token mask, ``(0.5, 5.0)`` in the Ring-1T report.
        clip_bounds: ``(low, high)`` ratio bounds of the trust region on ``r_s``.
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    reference_use = "required"

    def __init__(
        self,
        *,
        discrepancy_bounds: Sequence[float] = (0.5, 5.0),
        clip_bounds: Sequence[float] = (0.8, 1.2),
        aggregation: Aggregation = "token_mean",
        normalizer: float | None = None,
    ) -> None:
        super().__init__(aggregation=aggregation, normalizer=normalizer)
        self.discrepancy_bounds = check_bounds("discrepancy_bounds", discrepancy_bounds)
        self.clip_bounds = check_bounds("clip_bounds", clip_bounds)

    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        kept = in_bounds(ratio(inputs.ref_logprobs, inputs.behavior_logprobs), self.discrepancy_bounds)  # [B, T]
        staleness_ratio = ratio(inputs.logprobs, inputs.ref_logprobs)  # [B, T]
        surrogate, inside = clipped_surrogate(staleness_ratio, inputs.advantages, self.clip_bounds)
        return TokenTerms(objective=surrogate, discrepancy_mask=kept, clip_mask=inside)
