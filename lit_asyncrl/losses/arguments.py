"""Validation of constructor arguments; every error names the argument to change."""

from __future__ import annotations

import math
from collections.abc import Sequence

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "fixed")


def check_bounds(name: str, value: Sequence[float]) -> tuple[float, float]:
    """Return ``value`` as a ``(low, high)`` ratio pair with ``0 < low <= 1 <= high < inf``.

    Accepts any two-element sequence (Hydra hands over a ListConfig, the CLI a list).
    """
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair of ratios (low, high), got {value!r}") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"{name} must be finite, got {(low, high)}")
    if low <= 0:
        raise ValueError(f"{name}: low must be > 0 (bounds are ratios, not epsilons), got {low}")
    if low > high:
        raise ValueError(f"{name}: low must be <= high, got {(low, high)}")
    if not low <= 1.0 <= high:
        raise ValueError(f"{name} must contain 1.0 (the on-policy ratio), got {(low, high)}")
    return low, high


def check_positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def check_cap(name: str, value: float) -> float:
    """An upper ratio bound: finite and ``>= 1`` (it must keep the on-policy ratio 1.0)."""
    value = float(value)
    if not (math.isfinite(value) and value >= 1):
        raise ValueError(f"{name} must be a finite ratio >= 1, got {value}")
    return value


def check_floor(name: str, value: float | None) -> float | None:
    """A lower ratio bound in ``(0, 1]``, or None for no lower bound."""
    if value is None:
        return None
    value = float(value)
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be a ratio in (0, 1] or None (no lower bound), got {value}")
    return value


def check_greater_than_one(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 1):
        raise ValueError(f"{name} must be a finite number > 1, got {value}")
    return value


def check_alpha(name: str, value: float | None) -> float | None:
    """Interpolation weight of ``mu_old``: None (use ``1/(n+1)`` per token) or in ``(0, 1]``."""
    if value is None:
        return None
    value = float(value)
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be in (0, 1] or None (alpha = 1/(n+1) per token), got {value}")
    return value


def check_aggregation(aggregation: str, normalizer: float | None) -> tuple[str, float | None]:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if aggregation == "fixed":
        if normalizer is None:
            raise ValueError("normalizer is required when aggregation='fixed'")
        return aggregation, check_positive("normalizer", normalizer)
    if normalizer is not None:
        raise ValueError(f"normalizer is only used with aggregation='fixed', got aggregation={aggregation!r}")
    return aggregation, None
