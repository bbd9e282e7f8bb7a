r"""Proposition 1 / Appendix A: the bounds interpolation induces on the total ratio ``r = pi_theta/mu_old``.

With ``alpha`` the weight of ``mu_old`` (``alpha = 1/(n+1)`` for version gap ``n``), both decoupled
ratios are increasing functions of ``r`` alone, so the ``r_d`` mask and the ``r_s`` clip are intervals
on ``r``: interpolation re-parameterises one ratio's bounds, it does not add an independent reference.

Log-linear, ``log pi_prox = alpha log mu_old + (1 - alpha) log pi_theta``::

    r_d = pi_prox / mu_old   = r^(1 - alpha)
    r_s = pi_theta / pi_prox = r^alpha

    mask  low_d <= r^(1-alpha) <= high_d  <=>  low_d^(1/(1-alpha)) <= r <= high_d^(1/(1-alpha))
    clip  A >= 0: r^alpha <= high_c       <=>  r <= high_c^(1/alpha)
          A <  0: r^alpha >= low_c        <=>  r >= low_c^(1/alpha)

    with alpha = 1/(n+1): exponents (n+1)/n for the mask and n+1 for the clip.

Arithmetic, ``pi_prox = alpha mu_old + (1 - alpha) pi_theta``::

    r_d = alpha + (1 - alpha) r
    r_s = r / (alpha + (1 - alpha) r)            (increasing: d r_s / d r = alpha / r_d^2 > 0)

    mask  low_d <= alpha + (1-alpha) r <= high_d
          <=>  (low_d - alpha)/(1 - alpha) <= r <= (high_d - alpha)/(1 - alpha)
          (no lower bound, i.e. 0, when low_d <= alpha: r_d >= alpha for every r >= 0)
    clip  A >= 0: r <= high_c (alpha + (1-alpha) r)  <=>  r (1 - high_c (1-alpha)) <= high_c alpha
                  <=>  r <= high_c alpha / (1 - high_c (1 - alpha))   if high_c (1 - alpha) < 1,
                       no upper bound (inf) otherwise (r_s < 1/(1-alpha) for every r)
          A <  0: r >= low_c alpha / (1 - low_c (1 - alpha))        (denominator > 0 as low_c <= 1)

At ``alpha = 1`` (``n = 0``) both give ``pi_prox = mu_old``: ``r_d = 1`` (no mask bound) and ``r_s = r``.

A token passes gradient when it is inside the mask (``*_train_infer`` strategies only) and inside
the clip for its advantage sign: ``A >= 0``: ``mask_low <= r <= min(mask_high, clip_high)``;
``A < 0``: ``max(mask_low, clip_low) <= r <= mask_high``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from lit_asyncrl.losses.arguments import check_alpha, check_bounds

Interpolation = Literal["linear", "loglinear"]


@dataclass(frozen=True)
class EffectiveBounds:
    """Bounds on ``r = pi_theta / mu_old`` (inclusive); ``0`` / ``inf`` mean no bound on that side.

    Attributes:
        alpha: weight of ``mu_old`` in the interpolation.
        mask_low, mask_high: the ``r_d`` mask keeps the token iff ``mask_low <= r <= mask_high``.
        clip_low: with ``A < 0`` the clipped term passes gradient iff ``r >= clip_low``.
        clip_high: with ``A >= 0`` the clipped term passes gradient iff ``r <= clip_high``.
    """

    interpolation: Interpolation
    alpha: float
    mask_low: float
    mask_high: float
    clip_low: float
    clip_high: float

    def gradient_window(self, advantage_sign: int, *, with_mask: bool = True) -> tuple[float, float]:
        """``(low, high)`` on ``r`` where a token with that advantage sign passes gradient."""
        low, high = (self.mask_low, self.mask_high) if with_mask else (0.0, math.inf)
        if advantage_sign >= 0:
            return low, min(high, self.clip_high)
        return max(low, self.clip_low), high


def _loglinear(alpha: float, discrepancy: tuple[float, float], clip: tuple[float, float]) -> tuple[float, ...]:
    mask_exponent = 1.0 / (1.0 - alpha)
    return (
        discrepancy[0] ** mask_exponent,
        discrepancy[1] ** mask_exponent,
        clip[0] ** (1.0 / alpha),
        clip[1] ** (1.0 / alpha),
    )


def _linear(alpha: float, discrepancy: tuple[float, float], clip: tuple[float, float]) -> tuple[float, ...]:
    keep = 1.0 - alpha  # weight of pi_theta in pi_prox
    clip_high_denominator = 1.0 - clip[1] * keep
    return (
        max(0.0, (discrepancy[0] - alpha) / keep),
        (discrepancy[1] - alpha) / keep,
        clip[0] * alpha / (1.0 - clip[0] * keep),
        clip[1] * alpha / clip_high_denominator if clip_high_denominator > 0 else math.inf,
    )


def effective_bounds(
    interpolation: Interpolation,
    *,
    discrepancy_bounds: Sequence[float],
    clip_bounds: Sequence[float],
    version_gap: int | None = None,
    alpha: float | None = None,
) -> EffectiveBounds:
    """Mask and clip bounds on ``r = pi_theta / mu_old`` for an interpolated proximal policy.

    Args:
        interpolation: ``"linear"`` (``linear_prox``) or ``"loglinear"`` (``loglinear_prox``).
        discrepancy_bounds: ``(low, high)`` of the ``r_d`` mask.
        clip_bounds: ``(low, high)`` of the ``r_s`` trust region.
        version_gap: ``n >= 0``, giving ``alpha = 1/(n+1)``; exactly one of it and ``alpha``.
        alpha: fixed weight of ``mu_old`` in ``(0, 1]``.

    See the module docstring for the derivation.
    """
    discrepancy = check_bounds("discrepancy_bounds", discrepancy_bounds)
    clip = check_bounds("clip_bounds", clip_bounds)
    if (version_gap is None) == (alpha is None):
        raise ValueError("give exactly one of version_gap (alpha = 1/(n+1)) and alpha")
    if version_gap is not None:
        if int(version_gap) != version_gap or version_gap < 0:
            raise ValueError(f"version_gap must be an integer >= 0, got {version_gap}")
        alpha = 1.0 / (int(version_gap) + 1)
    alpha = check_alpha("alpha", alpha)
    if alpha == 1.0:  # pi_prox = mu_old: r_d = 1 is always kept, r_s = r
        return EffectiveBounds(interpolation, alpha, 0.0, math.inf, clip[0], clip[1])
    if interpolation == "loglinear":
        values = _loglinear(alpha, discrepancy, clip)
    elif interpolation == "linear":
        values = _linear(alpha, discrepancy, clip)
    else:
        raise ValueError(f"interpolation must be 'linear' or 'loglinear', got {interpolation!r}")
    return EffectiveBounds(interpolation, alpha, *values)
