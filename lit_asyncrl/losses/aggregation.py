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
