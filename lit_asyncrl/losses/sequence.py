"""Sequence-level log-ratios over the valid tokens of each row, for the sequence-level corrections."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_asyncrl.losses.aggregation import count_true
from lit_asyncrl.losses.ratios import LOG_RATIO_LIMIT


def sequence_log_ratio_sum(log_numerator: Tensor, log_denominator: Tensor, valid: Tensor) -> Tensor:
    """``sum_t log(num_t / den_t)`` over valid tokens, ``[B, 1]``, detached (a weight, not a path)."""
    log_ratio = torch.where(valid, log_numerator.detach() - log_denominator.detach(), 0.0)  # [B, T]
    return log_ratio.sum(dim=-1, keepdim=True)


def sequence_log_ratio_mean(log_numerator: Tensor, log_denominator: Tensor, valid: Tensor) -> Tensor:
    """``(1/|y|) sum_t log(num_t / den_t)``, the log of the geometric-mean ratio, ``[B, 1]``, detached."""
    tokens = count_true(valid, dim=-1, keepdim=True).clamp(min=1)  # [B, 1]
    return sequence_log_ratio_sum(log_numerator, log_denominator, valid) / tokens


def exp_ratio(log_ratio: Tensor) -> Tensor:
    """``exp`` of a sequence log-ratio, clamped like the token ratios (see ``LOG_RATIO_LIMIT``)."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
