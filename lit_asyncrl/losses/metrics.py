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

import math

import torch
from torch import Tensor

from lit_asyncrl.losses.chunks import row_chunks
from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import LOG_RATIO_LIMIT

GAP_BUCKETS = ("gap_0", "gap_1", "gap_2", "gap_3", "gap_4plus")
_TRASH_SLOT = len(GAP_BUCKETS)  # tokens that are not valid policy tokens land here and are ignored
_SLOTS = _TRASH_SLOT + 1
PER_ROW_SCATTER: bool | None = None  # None: per row on accelerators, flat on CPU (see _slot_table)
_PADDED = 16  # accumulator row length: 6 slots padded to 64 or 128 bytes
_ROWS = ("tokens", "kept", "clipped", "log_ratio", "excess", "excess_sq", "k3", "ratio_min", "ratio_max", "scalars")


def _summarise(stats: dict[str, float]) -> dict[str, float]:
    tokens = stats["tokens"]
    if tokens == 0:
        return {
            "train_infer_mask": 1.0, "ppo_clip_ratio": 0.0, "kl_k1": 0.0, "kl_k3": 0.0, "ess": 1.0,
            "ratio_min": 1.0, "ratio_mean": 1.0, "ratio_max": 1.0, "policy_tokens": 0.0,
        }  # fmt: skip
    # r = 1 + e with e = expm1(log r): sums of e keep the precision that sums of r near 1 would lose.
    # Far below 1 they lose sum r^2 instead: with every r ~ 0, n + 2 sum e + sum e^2 cancels to 0 (or
    # below), and the ESS is unknown from these sums (NaN, logged as such), not a division by zero.
    ratio_sum = tokens + stats["excess"]
    ratio_sq_sum = tokens + 2.0 * stats["excess"] + stats["excess_sq"]
    return {
        "train_infer_mask": stats["kept"] / tokens,
        "ppo_clip_ratio": stats["clipped"] / tokens,
        "kl_k1": -stats["log_ratio"] / tokens,
        "kl_k3": stats["k3"] / tokens,
        "ess": ratio_sum**2 / (tokens * ratio_sq_sum) if ratio_sq_sum > 0 else math.nan,
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
    with torch.no_grad():
        table = _slot_table(prepared, discrepancy_mask, clip_mask).tolist()  # one device-to-host transfer
    per_slot = [{name: table[row][s] for row, name in enumerate(_ROWS)} for s in range(_TRASH_SLOT)]

    total = {name: sum(stats[name] for stats in per_slot) for name in _ROWS[:7]}
    total["ratio_min"] = min(stats["ratio_min"] for stats in per_slot)  # empty slots hold +inf
    total["ratio_max"] = max(stats["ratio_max"] for stats in per_slot)
    metrics = _summarise(total)
    nonfinite, gap_sum, gap_max = table[-1][:3]
    metrics["nonfinite_tokens"] = nonfinite
    if prepared.version_gap is None:
        return metrics

    metrics["version_gap_mean"] = gap_sum / total["tokens"] if total["tokens"] else 0.0
    metrics["version_gap_max"] = gap_max
    for bucket_name, stats in zip(GAP_BUCKETS, per_slot):
        if stats["tokens"] > 0:
            metrics.update({f"{key}/{bucket_name}": value for key, value in _summarise(stats).items()})
    return metrics


def _slot_table(prepared: PreparedInputs, discrepancy_mask: Tensor | None, clip_mask: Tensor) -> Tensor:
    """float64 ``[len(_ROWS), _SLOTS]``: every statistic per slot, from one pass over the tokens.

    A token's slot is its version-gap bucket, or the trash slot when it is not a valid policy token.
    Counts come from one ``bincount`` of the code ``slot * 4 + 2 * kept + clipped``; the four sums
    (log r, e = r - 1, e^2, k3) from one ``scatter_add`` of their ``[4, n]`` rows and the extremes
    from one ``scatter_reduce`` of ``[e, -e]``, each row accumulated on its own in token order, as
    separate scatters would (and the rows run on different threads). Sums are in the compute dtype:
    the summed quantities are small and centred, so float32 drift stays ~1e-4 relative; counts,
    which are not small, are exact integers.

    On CPU the tokens go by row chunks (:func:`~lit_asyncrl.losses.chunks.row_chunks`) through
    reused buffers, into the same accumulators in token order: the chunking changes no value. On an
    accelerator (one chunk), a scatter of 4M tokens into 6 slots is 4M atomic updates of 6 addresses,
    serialised; there each row scatters into its own slots and the rows are reduced after.
    """
    valid = prepared.valid  # [B, T]
    gap = prepared.version_gap
    device = valid.device
    dtype = prepared.behavior_logprobs.dtype
    per_row = device.type != "cpu" if PER_ROW_SCATTER is None else PER_ROW_SCATTER
    counts = torch.zeros(_SLOTS * 4, dtype=torch.long, device=device)  # [24]: slot * 4 + 2 * kept + clipped
    # accumulator rows padded to 64 (float32) or 128 bytes: threads updating different rows share no
    # cache line
    sums = torch.zeros(4, _PADDED, dtype=dtype, device=device)[:, :_SLOTS]  # [4, 6]: log r, e, e^2, k3
    highest = torch.full((2, _PADDED), -torch.inf, dtype=dtype, device=device)[:, :_SLOTS]  # [2, 6]: max e, max -e
    gap_stats = torch.zeros(2, _SLOTS, dtype=torch.long, device=device)  # sum, max (gaps are >= 0)
    small_counts = torch.zeros_like(counts)  # counts of the chunks whose gaps are all <= 4

    chunks = list(row_chunks(valid))
    length = valid.shape[1]
    size = max((part.stop - part.start for part in chunks), default=0) * length
    # Work buffers reused by every chunk (out= and in-place ops): no allocation inside the loop.
    values_buffer = torch.empty(5, size, dtype=dtype, device=device)  # log r, e, e^2, k3, -e
    slot_buffer = torch.empty(size, dtype=torch.long, device=device)
    code_buffer = torch.empty(size, dtype=torch.uint8, device=device)
    for part in chunks:
        chunk_valid = valid[part].reshape(-1)
        n = chunk_valid.numel()
        values = values_buffer[:, :n]
        slot = slot_buffer[:n]
        code = code_buffer[:n]
        log_ratio = values[0]
        excess = values[1]
        torch.sub(prepared.logprobs[part].reshape(-1), prepared.behavior_logprobs[part].reshape(-1), out=log_ratio)
        log_ratio.clamp_(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        torch.expm1(log_ratio, out=excess)  # r - 1 with r = pi_theta / mu_old
        torch.mul(excess, excess, out=values[2])
        torch.sub(excess, log_ratio, out=values[3])  # k3 = (r - 1) - log r
        torch.neg(excess, out=values[4])

        # slot = min(gap, 4) on valid tokens, the trash slot 5 elsewhere: built in uint8, then widened
        # once to the int64 index that scatter needs
        chunk_gap = None if gap is None else gap[part].reshape(-1)
        # every gap of the chunk <= 4: the slot is the gap itself, the gap sums follow from the counts
        # (a host check, free on CPU only)
        small_gaps = chunk_gap is not None and not per_row and int(chunk_gap.amax()) < _TRASH_SLOT
        if chunk_gap is None:
            code.zero_()
        elif small_gaps:
            code.copy_(chunk_gap)
        else:
            code.copy_(torch.clamp(chunk_gap, max=_TRASH_SLOT - 1, out=slot))
        # uint8 in place, wrapping modulo 256 on the way: (code - 5) * valid + 5 is the bucket on valid
        # tokens and 5 elsewhere; then slot * 4 + 2 kept + (1 - inside) is the count code
        code.sub_(_TRASH_SLOT).mul_(chunk_valid.view(torch.uint8)).add_(_TRASH_SLOT)
        slot.copy_(code)
        kept = chunk_valid if discrepancy_mask is None else discrepancy_mask[part].reshape(-1)
        code.mul_(4).add_(kept.view(torch.uint8), alpha=2).sub_(clip_mask[part].reshape(-1).view(torch.uint8)).add_(1)
        chunk_counts = torch.bincount(code, minlength=_SLOTS * 4)
        counts += chunk_counts
        if small_gaps:
            small_counts += chunk_counts

        gaps = None if chunk_gap is None or small_gaps else chunk_gap
        if per_row:
            _scatter_per_row(slot.view(-1, length), values.view(5, -1, length), gaps, sums, highest, gap_stats)
        else:
            _scatter_flat(slot, values, gaps, sums, highest, gap_stats)

    by_code = counts.view(_SLOTS, 2, 2).to(torch.float64)  # [slot, kept, clipped]
    if gap is not None:  # the chunks with small gaps: a token's gap is its bucket
        buckets = torch.arange(_SLOTS, dtype=torch.long, device=device)
        small = small_counts.view(_SLOTS, 4).sum(dim=1)  # [6]
        gap_stats[0] += buckets * small
        gap_stats[1] = torch.maximum(gap_stats[1], torch.where(small > 0, buckets, 0))
    scalars = torch.zeros(_SLOTS, dtype=torch.float64, device=device)
    scalars[0] = prepared.nonfinite_tokens
    scalars[1] = gap_stats[0, :_TRASH_SLOT].sum()
    scalars[2] = gap_stats[1, :_TRASH_SLOT].max()
    return torch.cat(
        [
            by_code.sum(dim=(1, 2)).unsqueeze(0),  # tokens
            by_code[:, 1].sum(dim=1).unsqueeze(0),  # kept
            by_code[:, :, 1].sum(dim=1).unsqueeze(0),  # clipped
            sums.to(torch.float64),
            (-highest[1].to(torch.float64) + 1.0).unsqueeze(0),  # min e = -max(-e), exactly
            (highest[0].to(torch.float64) + 1.0).unsqueeze(0),
            scalars.unsqueeze(0),
        ]
    )


def _scatter_flat(
    slot: Tensor, values: Tensor, gaps: Tensor | None, sums: Tensor, highest: Tensor, gap_stats: Tensor
) -> None:
    """Accumulate one chunk (flat ``[n]`` slots, ``[5, n]`` values) into the ``[., 6]`` accumulators."""
    n = slot.numel()
    sums.scatter_add_(1, slot.expand(4, n), values[:4])
    highest.scatter_reduce_(1, slot.expand(2, n), values[1::3], "amax")
    if gaps is not None:  # the raw gaps (not bucketed) of the valid tokens
        gap_stats[0].scatter_add_(0, slot, gaps)
        gap_stats[1].scatter_reduce_(0, slot, gaps, "amax")


def _scatter_per_row(
    slot: Tensor, values: Tensor, gaps: Tensor | None, sums: Tensor, highest: Tensor, gap_stats: Tensor
) -> None:
    """The same from ``[rows, T]`` slots and ``[5, rows, T]`` values: per-row results, then reduced."""
    rows, length = slot.shape
    index = slot.unsqueeze(0)
    row_sums = torch.zeros(4, rows, _SLOTS, dtype=sums.dtype, device=sums.device)
    sums += row_sums.scatter_add_(2, index.expand(4, rows, length), values[:4]).sum(dim=1)
    row_highest = torch.full((2, rows, _SLOTS), -torch.inf, dtype=highest.dtype, device=highest.device)
    row_highest.scatter_reduce_(2, index.expand(2, rows, length), values[1::3], "amax")
    highest.copy_(torch.maximum(highest, row_highest.amax(dim=1)))
    if gaps is not None:
        gaps = gaps.view(rows, length)
        row_gaps = torch.zeros(2, rows, _SLOTS, dtype=torch.long, device=gap_stats.device)
        gap_stats[0] += row_gaps[0].scatter_add_(1, slot, gaps).sum(dim=0)
        gap_stats[1] = torch.maximum(gap_stats[1], row_gaps[1].scatter_reduce_(1, slot, gaps, "amax").amax(dim=0))
