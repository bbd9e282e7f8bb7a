"""Detached per-step diagnostics, globally and per version-gap bucket.

Keys (no prefix; the module logs them under ``train/``):

- ``train_infer_mask``: fraction of policy tokens kept by the ``r_d`` mask (paper Sec. 6.4).
- ``ppo_clip_ratio``: fraction of policy tokens outside the trust region (``clip_mask`` False).
- ``kl_k1``, ``kl_k3``: estimators of ``KL(mu_old || pi_theta)`` with tokens sampled from ``mu_old``,
  ``k1 = -log r`` and ``k3 = (r - 1) - log r`` with ``r = pi_theta / mu_old`` (Schulman, 2020).
- ``ess``: normalised effective sample size ``(sum r)^2 / (N sum r^2)`` of the weights ``r``, in (0, 1].
- ``ratio_min``, ``ratio_mean``, ``ratio_max``: of ``r = pi_theta / mu_old`` before any mask.
- ``policy_tokens``, ``nonfinite_tokens``: counts; ``version_gap_mean``, ``version_gap_max``.
- ``<key>/gap_0`` ... ``<key>/gap_3``, ``<key>/gap_4plus``: the same for the tokens of one version-gap
  bucket, emitted for non-empty buckets when ``version_gap`` is given.

With no policy token the neutral values are used: masks 1.0, clip ratio and KL 0.0, ESS and ratios 1.0.
All statistics come back to the host in one transfer.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import LOG_RATIO_LIMIT

GAP_BUCKETS = ("gap_0", "gap_1", "gap_2", "gap_3", "gap_4plus")
_TRASH_SLOT = len(GAP_BUCKETS)  # tokens that are not valid policy tokens land here and are ignored
_SLOTS = _TRASH_SLOT + 1
_ROWS = ("tokens", "kept", "clipped", "log_ratio", "excess", "excess_sq", "k3", "ratio_min", "ratio_max", "scalars")


def _count(slot: Tensor) -> Tensor:
    # scatter of an expanded (stride-0) int64 one: exact counts, no [B, T] temporary; bincount would
    # first scan the input for its min and max.
    flat = slot.reshape(-1)
    ones = torch.ones((), dtype=torch.long, device=slot.device).expand(flat.shape)
    counts = torch.zeros(_SLOTS, dtype=torch.long, device=slot.device).scatter_add_(0, flat, ones)
    return counts.to(torch.float64)  # [6]


def _slot_sum(slot: Tensor, values: Tensor) -> Tensor:
    # Accumulated in the compute dtype: a float64 copy of the batch would cost more than the sums.
    # The summed quantities (log r, r - 1, k3) are small and centred, so float32 drift stays ~1e-4
    # relative; counts, which are not small, are exact in _count.
    out = torch.zeros(_SLOTS, dtype=values.dtype, device=values.device)
    return out.scatter_add_(0, slot.reshape(-1), values.reshape(-1)).to(torch.float64)  # [6]


def _slot_extreme(slot: Tensor, values: Tensor, reduce: str) -> Tensor:
    start = torch.inf if reduce == "amin" else -torch.inf  # empty slots keep it
    out = torch.full((_SLOTS,), start, dtype=values.dtype, device=values.device)
    return out.scatter_reduce_(0, slot.reshape(-1), values.reshape(-1), reduce).to(torch.float64)  # [6]


def _summarise(stats: dict[str, float]) -> dict[str, float]:
    tokens = stats["tokens"]
    if tokens == 0:
        return {
            "train_infer_mask": 1.0, "ppo_clip_ratio": 0.0, "kl_k1": 0.0, "kl_k3": 0.0, "ess": 1.0,
            "ratio_min": 1.0, "ratio_mean": 1.0, "ratio_max": 1.0, "policy_tokens": 0.0,
        }  # fmt: skip
    # r = 1 + e with e = expm1(log r): sums of e keep the precision that sums of r near 1 would lose.
    ratio_sum = tokens + stats["excess"]
    ratio_sq_sum = tokens + 2.0 * stats["excess"] + stats["excess_sq"]
    return {
        "train_infer_mask": stats["kept"] / tokens,
        "ppo_clip_ratio": stats["clipped"] / tokens,
        "kl_k1": -stats["log_ratio"] / tokens,
        "kl_k3": stats["k3"] / tokens,
        "ess": ratio_sum**2 / (tokens * ratio_sq_sum),
        "ratio_min": stats["ratio_min"],
        "ratio_mean": ratio_sum / tokens,
        "ratio_max": stats["ratio_max"],
        "policy_tokens": tokens,
    }


def step_metrics(prepared: PreparedInputs, discrepancy_mask: Tensor | None, clip_mask: Tensor) -> dict[str, float]:
    """Compute the metrics above from the prepared inputs and the strategy's masks ``[B, T]``.

    Both masks must already be False outside ``prepared.valid``; ``discrepancy_mask`` None means the
    strategy has no ``r_d`` mask (every valid token kept).
    """
    valid = prepared.valid  # [B, T]
    log_ratio = (prepared.logprobs.detach() - prepared.behavior_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    excess = torch.expm1(log_ratio)  # [B, T], r - 1 with r = pi_theta / mu_old
    gap = prepared.version_gap
    device = valid.device
    bucket = gap.clamp(max=_TRASH_SLOT - 1) if gap is not None else torch.zeros((), dtype=torch.long, device=device)
    slot = torch.where(valid, bucket, _TRASH_SLOT)  # [B, T]

    valid_gap = torch.where(valid, gap, 0) if gap is not None else torch.zeros(1, dtype=torch.long, device=device)
    scalars = torch.zeros(_SLOTS, dtype=torch.float64, device=device)
    scalars[0] = prepared.nonfinite_tokens
    scalars[1] = valid_gap.sum()
    scalars[2] = valid_gap.max()
    tokens = _count(slot)
    rows = [
        tokens,
        tokens if discrepancy_mask is None else _count(torch.where(discrepancy_mask, slot, _TRASH_SLOT)),
        _count(torch.where(clip_mask, _TRASH_SLOT, slot)),
        _slot_sum(slot, log_ratio),
        _slot_sum(slot, excess),
        _slot_sum(slot, excess * excess),
        _slot_sum(slot, excess - log_ratio),  # k3 = (r - 1) - log r
        _slot_extreme(slot, excess, "amin") + 1.0,
        _slot_extreme(slot, excess, "amax") + 1.0,
        scalars,
    ]
    table = torch.stack(rows).tolist()  # one device-to-host transfer
    per_slot = [{name: table[row][s] for row, name in enumerate(_ROWS)} for s in range(_TRASH_SLOT)]

    total = {name: sum(stats[name] for stats in per_slot) for name in _ROWS[:7]}
    total["ratio_min"] = min(stats["ratio_min"] for stats in per_slot)  # empty slots hold +inf
    total["ratio_max"] = max(stats["ratio_max"] for stats in per_slot)
    metrics = _summarise(total)
    nonfinite, gap_sum, gap_max = table[-1][:3]
    metrics["nonfinite_tokens"] = nonfinite
    if gap is None:
        return metrics

    metrics["version_gap_mean"] = gap_sum / total["tokens"] if total["tokens"] else 0.0
    metrics["version_gap_max"] = gap_max
    for bucket_name, stats in zip(GAP_BUCKETS, per_slot):
        if stats["tokens"] > 0:
            metrics.update({f"{key}/{bucket_name}": value for key, value in _summarise(stats).items()})
    return metrics
