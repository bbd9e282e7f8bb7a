"""IcePop: token-level masked importance sampling on ``r_d`` (Ling Team, 2025, Ring-1T report)."""

from __future__ import annotations

from collections.abc import Sequence

from lit_asyncrl.losses.base import Aggregation
from lit_asyncrl.losses.decoupled import DecoupledPPO
from lit_asyncrl.losses.registry import register_loss


@register_loss("icepop")
class IcePop(DecoupledPPO):
    """``M(k) * min(r_s A, clip(r_s) A)`` with ``M(k) = k`` on ``[low, high]`` and 0 outside.

    The Ring-1T report (and INTELLECT-3, eq. 1) write ``k = pi_train(theta_old) / pi_infer(theta_old)``,
    here ``r_d = pi_ref / mu_old``, and ``r_s = pi_theta / pi_ref``. ``k`` is computed from detached
    old log-probs: a constant weight, no gradient. Kept tokens are therefore re-weighted by ``k`` and
    the rest dropped on either side, which is :class:`~lit_asyncrl.losses.decoupled.DecoupledPPO`'s
    ``M(r_d) sg(r_d)``: IcePop is that objective with the report's mask bounds as defaults.
    Needs ``ref_logprobs``.

    Args:
        discrepancy_bounds: ``(low, high)`` = ``(alpha, beta)`` of ``M``, ``(0.5, 5.0)`` in the Ring-1T report.
        clip_bounds: ``(low, high)`` ratio bounds of the trust region on ``r_s``.
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    def __init__(
        self,
        *,
        discrepancy_bounds: Sequence[float] = (0.5, 5.0),
        clip_bounds: Sequence[float] = (0.8, 1.2),
        aggregation: Aggregation = "token_mean",
        normalizer: float | None = None,
    ) -> None:
        super().__init__(
            discrepancy_bounds=discrepancy_bounds,
            clip_bounds=clip_bounds,
            aggregation=aggregation,
            normalizer=normalizer,
        )
