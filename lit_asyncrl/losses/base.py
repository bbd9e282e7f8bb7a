"""The shared base of every loss strategy: prepare inputs, per-token terms, mask, aggregate, measure."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

import torch
from torch import Tensor

from lit_asyncrl.losses.aggregation import aggregate
from lit_asyncrl.losses.arguments import check_aggregation, check_bounds
from lit_asyncrl.losses.inputs import LossInputs, LossOutput, PreparedInputs, prepare_inputs
from lit_asyncrl.losses.metrics import step_metrics

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "fixed"]


@dataclass
class TokenTerms:
    """What a strategy computes per token.

    Attributes:
        objective: ``[B, T]`` surrogate to maximise, importance weights already applied; gradient only
            through ``log pi_theta``. The base zeroes it outside ``discrepancy_mask`` and invalid tokens.
        discrepancy_mask: bool ``[B, T]``, kept by the ``r_d`` mask (symmetric, except MIS's one-sided
            default); None when the strategy has no such mask (every valid token kept).
        clip_mask: bool ``[B, T]``, inside the trust region for the token's advantage sign.
    """

    objective: Tensor
    discrepancy_mask: Tensor | None
    clip_mask: Tensor


class LossStrategy(ABC):
    """Base of all strategies: ``loss_fn(LossInputs) -> LossOutput``.

    Subclasses implement :meth:`token_terms` only; they take explicit numeric constructor arguments,
    which map 1:1 to config keys (Hydra ``loss=<name>``, Lightning CLI ``class_path``).

    Attributes:
        name: the name it is registered under (see :func:`lit_asyncrl.losses.get_loss`).
        reference_use: ``"required"`` (``ref_logprobs`` must be given), ``"optional"`` (``pi_ref`` if
            given, else ``mu_old``) or ``"ignored"`` (the strategy builds its own proximal policy).
    """

    name: ClassVar[str] = ""
    reference_use: ClassVar[Literal["required", "optional", "ignored"]] = "optional"

    def __init__(self, *, aggregation: Aggregation = "token_mean", normalizer: float | None = None) -> None:
        self.aggregation, self.normalizer = check_aggregation(aggregation, normalizer)

    @abstractmethod
    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        """Per-token objective and masks for finite, detached-where-needed inputs."""

    def __call__(self, inputs: LossInputs) -> LossOutput:
        if self.reference_use == "required" and inputs.ref_logprobs is None:
            raise ValueError(
                f"{self.name or type(self).__name__} needs ref_logprobs (log pi_ref: exact old logits, "
                "async recompute or EWMA); configure a reference source"
            )
        prepared = prepare_inputs(inputs, use_reference=self.reference_use != "ignored")
        terms = self.token_terms(prepared)
        valid = prepared.valid  # [B, T]
        discrepancy_mask = valid if terms.discrepancy_mask is None else terms.discrepancy_mask & valid  # [B, T]
        clip_mask = terms.clip_mask & valid  # [B, T]
        zero = torch.zeros((), dtype=terms.objective.dtype, device=valid.device)
        kept_objective = torch.where(discrepancy_mask, terms.objective, zero)  # [B, T]
        loss = -aggregate(kept_objective, valid, self.aggregation, self.normalizer)
        has_mask = terms.discrepancy_mask is not None
        metrics = step_metrics(prepared, discrepancy_mask if has_mask else None, clip_mask)
        return LossOutput(
            loss=loss, discrepancy_mask=discrepancy_mask, clip_mask=clip_mask, metrics=metrics, valid=valid
        )

    def proxy_logprobs(self, inputs: LossInputs) -> Tensor:
        """What this strategy puts where the exact ``log pi_old`` belongs ``[B, T]``, detached.

        ``pi_ref`` when the strategy reads one and it is given, else ``mu_old``. Reference fidelity
        (``lit_asyncrl.fidelity``) compares it with the exact old log-probs.
        """
        if self.reference_use != "ignored" and inputs.ref_logprobs is not None:
            return inputs.ref_logprobs.detach()
        return inputs.behavior_logprobs.detach()

    def discrepancy_mask_under(self, inputs: LossInputs, exact_logprobs: Tensor) -> Tensor | None:
        """The ``r_d`` mask this strategy would apply with ``exact_logprobs`` (exact ``log pi_old``)
        as its reference, bool ``[B, T]``; None when the strategy has no such mask.
        """
        exact_inputs = replace(inputs, logprobs=inputs.logprobs.detach(), ref_logprobs=exact_logprobs)
        with torch.no_grad():
            prepared = prepare_inputs(exact_inputs, use_reference=True)
            terms = self.token_terms(prepared)
        return None if terms.discrepancy_mask is None else terms.discrepancy_mask & prepared.valid

    def __repr__(self) -> str:
        arguments = ", ".join(f"{key}={value!r}" for key, value in vars(self).items())
        return f"{type(self).__name__}({arguments})"


class ClippedLossStrategy(LossStrategy):
    """A strategy with a trust region on a ratio, by advantage sign or on a weight: ``clip_bounds``.

    Args:
        clip_bounds: ``(low, high)`` ratio bounds of the trust region.
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    def __init__(
        self,
        *,
        clip_bounds: Sequence[float] = (0.8, 1.2),
        aggregation: Aggregation = "token_mean",
        normalizer: float | None = None,
    ) -> None:
        super().__init__(aggregation=aggregation, normalizer=normalizer)
        self.clip_bounds = check_bounds("clip_bounds", clip_bounds)
