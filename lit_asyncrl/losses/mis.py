"""Sequence-level masked importance sampling on ``r_d`` (Liu, Yao et al., 2025, "When Speed Kills
Stability"; verl ``rollout_rs``/``rollout_is``, ROLL, SkyRL)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor

from lit_asyncrl.losses.arguments import check_bounds, check_cap, check_floor
from lit_asyncrl.losses.base import Aggregation, LossStrategy, TokenTerms
from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import clipped_surrogate, ratio
from lit_asyncrl.losses.registry import register_loss
from lit_asyncrl.losses.sequence import exp_ratio, sequence_log_ratio_mean, sequence_log_ratio_sum


class SequenceMaskedImportanceSampling(LossStrategy):
    """Reject whole sequences whose ``r_d`` statistic exceeds ``discrepancy_cap``; PPO-clip on ``r_s``.

    As its authors define MIS, rejection is one-sided by default: only a statistic above the cap
    ``C`` drops the sequence. ``discrepancy_floor`` adds a lower rejection (two-sided, as verl's
    ``rollout_rs`` lower threshold). Both bounds are inclusive. Needs ``ref_logprobs``;
    ``r_d,t = pi_ref / mu_old``, ``r_s = pi_theta / pi_ref``.

    Args:
        discrepancy_cap: ``C >= 1``; a sequence is kept while its statistic is ``<= C`` (2.0, as in Yao et al.).
        discrepancy_floor: None (the default: no lower rejection), or a ratio in ``(0, 1]`` below which
            the sequence is rejected too.
        clip_bounds: ``(low, high)`` ratio bounds of the trust region on ``r_s``.
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    reference_use = "required"

    def __init__(
        self,
        *,
        discrepancy_cap: float = 2.0,
        discrepancy_floor: float | None = None,
        clip_bounds: Sequence[float] = (0.8, 1.2),
        aggregation: Aggregation = "token_mean",
        normalizer: float | None = None,
    ) -> None:
        super().__init__(aggregation=aggregation, normalizer=normalizer)
        self.discrepancy_cap = check_cap("discrepancy_cap", discrepancy_cap)
        self.discrepancy_floor = check_floor("discrepancy_floor", discrepancy_floor)
        self.clip_bounds = check_bounds("clip_bounds", clip_bounds)

    @abstractmethod
    def sequence_weight_and_statistic(self, inputs: PreparedInputs) -> tuple[Tensor, Tensor]:
        """Stop-gradient weight ``[B, 1]`` and the statistic the mask tests ``[B, 1]``."""

    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        weight, statistic = self.sequence_weight_and_statistic(inputs)  # [B, 1], [B, 1]
        kept = statistic <= self.discrepancy_cap  # [B, 1]
        if self.discrepancy_floor is not None:
            kept = kept & (statistic >= self.discrepancy_floor)
        staleness_ratio = ratio(inputs.logprobs, inputs.ref_logprobs)  # [B, T]
        surrogate, inside = clipped_surrogate(staleness_ratio, inputs.advantages, self.clip_bounds)
        return TokenTerms(objective=weight * surrogate, discrepancy_mask=kept.expand_as(inputs.valid), clip_mask=inside)


@register_loss("mis_sequence")
class SequenceMIS(SequenceMaskedImportanceSampling):
    """``rho = prod_t r_d,t``; weight ``sg(rho)`` on sequences with ``rho <= C`` (and ``>= floor``), 0 otherwise."""

    def sequence_weight_and_statistic(self, inputs: PreparedInputs) -> tuple[Tensor, Tensor]:
        rho = exp_ratio(sequence_log_ratio_sum(inputs.ref_logprobs, inputs.behavior_logprobs, inputs.valid))
        return rho, rho  # [B, 1]


@register_loss("mis_geometric")
class GeometricMIS(SequenceMaskedImportanceSampling):
    """Rejection by the geometric mean ``exp(mean_t log r_d,t)``, length-independent; no re-weighting."""

    def sequence_weight_and_statistic(self, inputs: PreparedInputs) -> tuple[Tensor, Tensor]:
        geometric = exp_ratio(sequence_log_ratio_mean(inputs.ref_logprobs, inputs.behavior_logprobs, inputs.valid))
        return torch.ones_like(geometric), geometric  # [B, 1]
