"""Per-token statistics summarised overall and per version-gap bucket (`<key>/gap_0` ... `/gap_4plus`)."""

from __future__ import annotations

import torch

from lit_asyncrl.losses.metrics import GAP_BUCKETS


def abs_stats_by_gap(
    values: torch.Tensor, tokens: torch.Tensor, version_gap: torch.Tensor, prefix: str
) -> dict[str, float]:
    """Mean and maximum of `values` [B, T] over `tokens` (bool [B, T]), overall and per gap bucket.

    Keys: `<prefix>absmean`, `<prefix>absmax` and the same with `/gap_n` for every bucket that has
    tokens (a bucket without tokens is absent, not zero). Empty when no token is selected.
    """
    if not tokens.any():
        return {}
    metrics = {f"{prefix}absmean": values[tokens].mean().item(), f"{prefix}absmax": values[tokens].max().item()}
    bucket = version_gap.clamp(0, len(GAP_BUCKETS) - 1)  # the last bucket is gap_4plus; a negative gap counts as 0
    for index in torch.unique(bucket[tokens]).tolist():
        selected = values[tokens & (bucket == index)]
        metrics[f"{prefix}absmean/{GAP_BUCKETS[index]}"] = selected.mean().item()
        metrics[f"{prefix}absmax/{GAP_BUCKETS[index]}"] = selected.max().item()
    return metrics


def fraction_by_gap(flags: torch.Tensor, tokens: torch.Tensor, version_gap: torch.Tensor, key: str) -> dict[str, float]:
    """Fraction of `tokens` where `flags` (bool [B, T]) holds, as `key` and `key/gap_n` per bucket."""
    if not tokens.any():
        return {}
    metrics = {key: flags[tokens].float().mean().item()}
    bucket = version_gap.clamp(0, len(GAP_BUCKETS) - 1)
    for index in torch.unique(bucket[tokens]).tolist():
        metrics[f"{key}/{GAP_BUCKETS[index]}"] = flags[tokens & (bucket == index)].float().mean().item()
    return metrics
