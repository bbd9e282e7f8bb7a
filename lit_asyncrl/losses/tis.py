"""Truncated importance sampling on ``r_d`` (Yao et al., 2025, "Your Efficient RL Framework Secretly
Brings You Off-Policy RL Training"; verl/slime/SkyRL ``tis``)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import torch

from lit_asyncrl.losses.arguments import check_positive
from lit_asyncrl.losses.base import Aggregation, ClippedLossStrategy, TokenTerms
from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import clipped_surrogate, ratio
from lit_asyncrl.losses.registry import register_loss
from lit_asyncrl.losses.sequence import exp_ratio, sequence_log_ratio_sum


class TruncatedImportanceSampling(ClippedLossStrategy):
    """``sg(min(rho, C)) * min(r_s A, clip(r_s) A)`` with ``r_s = pi_theta / pi_ref``.

    ``rho`` is built from ``r_d = pi_ref / mu_old``; truncation only caps it from above and drops no
    token (``discrepancy_mask`` is all True). Needs ``ref_logprobs``.

    Args:
        clip_bounds: ``(low, high)`` ratio bounds of the trust region on ``r_s``.
        weight_cap: ``C > 0``, the truncation of the importance weight (2.0 in Yao et al.).
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    reference_use = "required"

    def __init__(
        self,
        *,
        clip_bounds: Sequence[float] = (0.8, 1.2),
        weight_cap: float = 2.0,
        aggregation: Aggregation = "token_mean",
        normalizer: float | None = None,
    ) -> None:
        super().__init__(clip_bounds=clip_bounds, aggregation=aggregation, normalizer=normalizer)
        self.weight_cap = check_positive("weight_cap", weight_cap)

    @abstractmethod
    def importance_weight(self, inputs: PreparedInputs) -> torch.Tensor:
        """Untruncated ``rho``, ``[B, T]`` or ``[B, 1]``, detached."""

    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        weight = self.importance_weight(inputs).clamp(max=self.weight_cap)  # [B, T] or [B, 1]
        staleness_ratio = ratio(inputs.logprobs, inputs.ref_logprobs)  # [B, T]
        surrogate, inside = clipped_surrogate(staleness_ratio, inputs.advantages, self.clip_bounds)
        return TokenTerms(objective=weight * surrogate, discrepancy_mask=None, clip_mask=inside)


@register_loss("tis_token")
class TokenTIS(TruncatedImportanceSampling):
    """Token-level TIS: ``rho_t = r_d,t = pi_ref / mu_old``."""

    def importance_weight(self, inputs: PreparedInputs) -> torch.Tensor:
        return ratio(inputs.ref_logprobs, inputs.behavior_logprobs)  # [B, T]


@register_loss("tis_sequence")
class SequenceTIS(TruncatedImportanceSampling):
    """Sequence-level TIS: ``rho = prod_t r_d,t`` over the sequence's valid tokens, shared by them."""

    def importance_weight(self, inputs: PreparedInputs) -> torch.Tensor:
        log_rho = sequence_log_ratio_sum(inputs.ref_logprobs, inputs.behavior_logprobs, inputs.valid)  # [B, 1]
        return exp_ratio(log_rho)
