"""Decoupled PPO with the train-infer mask (Table 1 "decoupled PPO & train_infer")."""

from __future__ import annotations

from collections.abc import Sequence

from lit_asyncrl.losses.arguments import check_bounds
from lit_asyncrl.losses.base import Aggregation, LossStrategy, TokenTerms
from lit_asyncrl.losses.discrepancy import masked_discrepancy_weight
from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import clipped_surrogate, ratio
from lit_asyncrl.losses.registry import register_loss


@register_loss("decoupled_ppo")
class DecoupledPPO(LossStrategy):
    """``M(r_d) * sg(r_d) * min(r_s A, clip(r_s) A)``, ``r_d = pi_ref/mu_old``, ``r_s = pi_theta/pi_ref``.

    Paper Eq. 4 / Table 1 (decoupled PPO, Hilton et al. 2022; Zheng et al. 2025). ``r_d`` is a
    symmetric mask (token dropped when outside ``discrepancy_bounds``) and a stop-gradient weight on
    the kept tokens, so ``r_d * r_s = pi_theta / mu_old`` is the full importance ratio. ``r_s`` is
    clipped by advantage sign. ``pi_ref`` is whatever ``ref_logprobs`` holds: exact old logits
    (snapshot, old-logit model, interruption-sync), the EWMA reference ("PPO-EWMA & train_infer") or
    an async recompute ("decoupled PPO & Async").

    Args:
        discrepancy_bounds: ``(low, high)`` ratio bounds of the ``r_d`` mask, e.g. ``(0.99, 1.01)`` (the
            paper's experiments, Table 4).
        clip_bounds: ``(low, high)`` ratio bounds of the ``r_s`` trust region, e.g. ``(0.997, 1.004)`` (idem).
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    reference_use = "required"

    def __init__(
        self,
        *,
        discrepancy_bounds: Sequence[float] = (0.5, 2.0),
        clip_bounds: Sequence[float] = (0.8, 1.2),
        aggregation: Aggregation = "token_mean",
        normalizer: float | None = None,
    ) -> None:
        super().__init__(aggregation=aggregation, normalizer=normalizer)
        self.discrepancy_bounds = check_bounds("discrepancy_bounds", discrepancy_bounds)
        self.clip_bounds = check_bounds("clip_bounds", clip_bounds)

    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        weight, kept = masked_discrepancy_weight(inputs.ref_logprobs, inputs.behavior_logprobs, self.discrepancy_bounds)
        staleness_ratio = ratio(inputs.logprobs, inputs.ref_logprobs)  # [B, T]
        surrogate, inside = clipped_surrogate(staleness_ratio, inputs.advantages, self.clip_bounds)
        return TokenTerms(objective=weight * surrogate, discrepancy_mask=kept, clip_mask=inside)
