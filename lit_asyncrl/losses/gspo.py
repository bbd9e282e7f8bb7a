"""GSPO: group sequence policy optimisation, sequence-level ratio (Zheng et al., 2025, Qwen)."""

from __future__ import annotations

from collections.abc import Sequence

from lit_asyncrl.losses.base import Aggregation, ClippedLossStrategy, TokenTerms
from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import clipped_surrogate, unit_with_gradient
from lit_asyncrl.losses.registry import register_loss
from lit_asyncrl.losses.sequence import exp_ratio, sequence_log_ratio_mean


@register_loss("gspo")
class GSPO(ClippedLossStrategy):
    """GSPO-token (GSPO Eq. 13): ``s_t = sg(s) * pi_theta,t / sg(pi_theta,t)``, clipped like PPO.

    ``s = exp(mean_t log(pi_theta / pi_ref))`` over the sequence's valid tokens (``mu_old`` without a
    reference). Every token carries the value ``s`` (so the clip decision is per sequence and
    advantage sign) and the gradient ``s A_t grad log pi_t``; with a sequence advantage and the
    default ``seq_mean_token_mean`` aggregation this is exactly GSPO's sequence objective.

    Args:
        clip_bounds: ``(low, high)``; the GSPO paper uses ``(1 - 3e-4, 1 + 4e-4)``.
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    reference_use = "optional"

    def __init__(
        self,
        *,
        clip_bounds: Sequence[float] = (0.9997, 1.0004),
        aggregation: Aggregation = "seq_mean_token_mean",
        normalizer: float | None = None,
    ) -> None:
        super().__init__(clip_bounds=clip_bounds, aggregation=aggregation, normalizer=normalizer)

    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        log_sequence_ratio = sequence_log_ratio_mean(inputs.logprobs, inputs.anchor_logprobs, inputs.valid)  # [B, 1]
        token_ratio = exp_ratio(log_sequence_ratio) * unit_with_gradient(inputs.logprobs)  # [B, T]
        surrogate, inside = clipped_surrogate(token_ratio, inputs.advantages, self.clip_bounds)
        return TokenTerms(objective=surrogate, discrepancy_mask=None, clip_mask=inside)
