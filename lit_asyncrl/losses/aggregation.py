"""Reduce a per-token loss ``[B, T]`` to the scalar the optimiser sees.

Tokens dropped by a mask (discrepancy, trust region, rejection) stay in the denominator: a mask is an
importance weight of 0, so the gradient scale of the kept tokens does not jump with the mask ratio.
Only tokens that are not policy tokens, or whose inputs were non-finite, leave the denominator.
"""

from __future__ import annotations

import torch
from torch import Tensor


def count_true(mask: Tensor, dim: int | None = None, *, keepdim: bool = False) -> Tensor:
    """``mask.sum(dim)`` for a bool mask: the same counts, without the bool reduction (slow on CPU).

    The whole-tensor count is int64; per-row counts are int32 (a row is far shorter than 2**31).
    """
    if dim is None:
        return torch.count_nonzero(mask)
    return mask.view(torch.uint8).sum(dim=dim, keepdim=keepdim, dtype=torch.int32)


def aggregate(token_loss: Tensor, valid: Tensor, aggregation: str, normalizer: float | None = None) -> Tensor:
    """Aggregate ``token_loss`` (already 0 outside ``valid``) over the batch.

    Args:
        token_loss: ``[B, T]`` (a per-token loss or objective: aggregation is linear).
        valid: bool ``[B, T]``, the tokens that count in the denominators.
        aggregation: ``token_mean``: ``sum / #valid tokens`` (DAPO);
            ``seq_mean_token_mean``: mean over sequences of the per-sequence token mean (GRPO, GSPO);
            ``seq_mean_token_sum``: mean over sequences of the per-sequence token sum;
            ``fixed``: ``sum / normalizer`` (Dr. GRPO's constant).
        normalizer: the constant of ``fixed``.

    Sequences without a valid token are left out of the sequence means; with no valid token at all
    the result is exactly 0 with a zero gradient.
    """
    if aggregation == "token_mean":
        return token_loss.sum() / count_true(valid).clamp(min=1)
    if aggregation == "fixed":
        return token_loss.sum() / normalizer
    tokens_per_sequence = count_true(valid, dim=-1).to(token_loss.dtype)  # [B]
    sequence_loss = token_loss.sum(dim=-1)  # [B]
    if aggregation == "seq_mean_token_mean":
        sequence_loss = sequence_loss / tokens_per_sequence.clamp(min=1.0)
    elif aggregation != "seq_mean_token_sum":
        raise ValueError(f"unknown aggregation {aggregation!r}")
    sequences = (tokens_per_sequence > 0).to(token_loss.dtype).sum()
    return sequence_loss.sum() / sequences.clamp(min=1.0)


def aggregation_denominator(valid: Tensor, aggregation: str) -> Tensor:
    """What `aggregate` divides this batch's sum by: valid tokens (``token_mean``) or sequences with
    a valid token (the sequence means), as a float scalar. ``fixed`` has no batch-dependent one."""
    if aggregation == "token_mean":
        return count_true(valid).to(torch.float32)
    if aggregation in ("seq_mean_token_mean", "seq_mean_token_sum"):
        return (count_true(valid, dim=-1) > 0).sum().to(torch.float32)
    raise ValueError(f"aggregation {aggregation!r} has no batch denominator")


def global_batch_scale(valid: Tensor, aggregation: str, world_size: int, sum_over_ranks) -> Tensor:
    """Factor that makes a rank's loss, aggregated over its own shard, its part of the loss over
    the global batch, given that DDP averages gradients over the `world_size` ranks.

    A rank's loss is ``sum_r / d_r``; the global batch's is ``sum(sum_r) / D`` with ``D = sum(d_r)``
    (a mean's denominator over all ranks) or ``D = d`` (``fixed``'s constant, already global). DDP
    averages, so rank r's loss is scaled by ``world_size * d_r / D``: ``world_size * d_r / sum(d_r)``,
    or ``world_size`` for ``fixed``. Shards of unequal token counts then weigh each token alike,
    as one process on the whole batch would.

    Args:
        valid: bool ``[B, T]``, this rank's tokens in the denominators (``LossOutput.valid``).
        sum_over_ranks: ``tensor -> tensor`` summed over all ranks (an all-reduce).
    """
    if aggregation == "fixed":
        return torch.tensor(float(world_size))
    local = aggregation_denominator(valid, aggregation)
    total = sum_over_ranks(local.clone())
    return world_size * local / total.clamp(min=1.0)
