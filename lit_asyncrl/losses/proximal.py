"""Table 1 rows with an interpolated proximal policy: ``linear_prox`` / ``loglinear_prox`` (+ train_infer).

``r_s = pi_theta / pi_prox`` is clipped by advantage sign. Without the train-infer mask ``r_d = 1``
(Table 1); with it, ``r_d = pi_prox / mu_old`` is masked symmetrically and used as a stop-gradient
weight, as in :class:`~lit_asyncrl.losses.decoupled.DecoupledPPO`. Both ratios are deterministic
functions of ``r = pi_theta / mu_old`` (Proposition 1); see :func:`lit_asyncrl.losses.bounds.effective_bounds`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor

from lit_asyncrl.losses.arguments import check_alpha, check_bounds
from lit_asyncrl.losses.base import Aggregation, ClippedLossStrategy, TokenTerms
from lit_asyncrl.losses.discrepancy import masked_discrepancy_weight
from lit_asyncrl.losses.inputs import LossInputs, PreparedInputs, prepare_inputs
from lit_asyncrl.losses.interpolation import interpolation_alpha, linear_proximal_logprobs, loglinear_proximal_logprobs
from lit_asyncrl.losses.ratios import clipped_surrogate, ratio
from lit_asyncrl.losses.registry import register_loss


class InterpolatedProximal(ClippedLossStrategy):
    """Shared maths; subclasses choose the interpolation and the ``r_d`` correction.

    Args:
        clip_bounds: ``(low, high)`` ratio bounds of the trust region on ``r_s``.
        alpha: fixed weight of ``mu_old`` in ``(0, 1]``; None uses ``1/(n+1)`` per token (needs
            ``version_gap``).
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    reference_use = "ignored"

    def __init__(
        self,
        *,
        clip_bounds: Sequence[float] = (0.8, 1.2),
        alpha: float | None = None,
        aggregation: Aggregation = "token_mean",
        normalizer: float | None = None,
    ) -> None:
        super().__init__(clip_bounds=clip_bounds, aggregation=aggregation, normalizer=normalizer)
        self.alpha = check_alpha("alpha", alpha)

    @abstractmethod
    def proximal_logprobs(self, logprobs: Tensor, behavior_logprobs: Tensor, alpha: Tensor) -> Tensor:
        """``log pi_prox`` ``[B, T]``, detached."""

    def discrepancy_correction(
        self, log_proximal: Tensor, behavior_logprobs: Tensor
    ) -> tuple[Tensor | None, Tensor | None]:
        """Weight and mask from ``r_d``; None, None: Table 1 has ``r_d = 1`` without the train-infer mask."""
        return None, None

    def proxy_logprobs(self, inputs: LossInputs) -> Tensor:
        """``log pi_prox``: the interpolation stands where ``log pi_old`` belongs."""
        with torch.no_grad():
            prepared = prepare_inputs(inputs, use_reference=False)
            alpha = interpolation_alpha(prepared.version_gap, self.alpha, like=prepared.behavior_logprobs)
            return self.proximal_logprobs(prepared.logprobs, prepared.behavior_logprobs, alpha)

    def discrepancy_mask_under(self, inputs: LossInputs, exact_logprobs: Tensor) -> Tensor | None:
        """The ``r_d`` mask on ``pi_old / mu_old`` instead of ``pi_prox / mu_old``; None without the mask."""
        with torch.no_grad():
            prepared = prepare_inputs(
                replace(inputs, logprobs=inputs.logprobs.detach(), ref_logprobs=exact_logprobs), use_reference=True
            )
            _, kept = self.discrepancy_correction(prepared.ref_logprobs, prepared.behavior_logprobs)
        return None if kept is None else kept & prepared.valid

    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        alpha = interpolation_alpha(inputs.version_gap, self.alpha, like=inputs.behavior_logprobs)  # [B, T]
        log_proximal = self.proximal_logprobs(inputs.logprobs, inputs.behavior_logprobs, alpha)  # [B, T]
        weight, kept = self.discrepancy_correction(log_proximal, inputs.behavior_logprobs)
        staleness_ratio = ratio(inputs.logprobs, log_proximal)  # [B, T]
        surrogate, inside = clipped_surrogate(staleness_ratio, inputs.advantages, self.clip_bounds)
        objective = surrogate if weight is None else weight * surrogate
        return TokenTerms(objective=objective, discrepancy_mask=kept, clip_mask=inside)


@register_loss("linear_prox")
class LinearProx(InterpolatedProximal):
    """Table 1 "linear_prox": ``pi_prox = alpha mu_old + (1 - alpha) pi_theta``, ``r_d = 1``."""

    def proximal_logprobs(self, logprobs: Tensor, behavior_logprobs: Tensor, alpha: Tensor) -> Tensor:
        return linear_proximal_logprobs(logprobs, behavior_logprobs, alpha)


@register_loss("loglinear_prox")
class LogLinearProx(InterpolatedProximal):
    """Log-linear proximal (A-3PO, Appendix A): ``log pi_prox = alpha log mu_old + (1-alpha) log pi_theta``."""

    def proximal_logprobs(self, logprobs: Tensor, behavior_logprobs: Tensor, alpha: Tensor) -> Tensor:
        return loglinear_proximal_logprobs(logprobs, behavior_logprobs, alpha)


class TrainInferMask(InterpolatedProximal):
    """Adds the train-infer mask to an interpolated proximal: ``M(r_d) sg(r_d)``, ``r_d = pi_prox / mu_old``.

    Args:
        discrepancy_bounds: ``(low, high)`` ratio bounds of the symmetric ``r_d`` mask.
        clip_bounds, alpha, aggregation, normalizer: as :class:`InterpolatedProximal`.
    """

    def __init__(
        self,
        *,
        discrepancy_bounds: Sequence[float] = (0.5, 2.0),
        clip_bounds: Sequence[float] = (0.8, 1.2),
        alpha: float | None = None,
        aggregation: Aggregation = "token_mean",
        normalizer: float | None = None,
    ) -> None:
        super().__init__(clip_bounds=clip_bounds, alpha=alpha, aggregation=aggregation, normalizer=normalizer)
        self.discrepancy_bounds = check_bounds("discrepancy_bounds", discrepancy_bounds)

    def discrepancy_correction(self, log_proximal: Tensor, behavior_logprobs: Tensor) -> tuple[Tensor, Tensor]:
        return masked_discrepancy_weight(log_proximal, behavior_logprobs, self.discrepancy_bounds)


@register_loss("linear_prox_train_infer")
class LinearProxTrainInfer(TrainInferMask, LinearProx):
    """Table 1 "linear_prox & train_infer": the linear proximal with the train-infer mask (`TrainInferMask`)."""


@register_loss("loglinear_prox_train_infer")
class LogLinearProxTrainInfer(TrainInferMask, LogLinearProx):
    """The log-linear proximal with the train-infer mask (`TrainInferMask`)."""
