"""M2PO: second-moment trust region (Zheng et al., 2025, "Prosperity before Collapse: How Far Can
Off-Policy RL Reach with Stale Data on LLMs?"; AReaL)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from lit_asyncrl.losses.aggregation import count_true
from lit_asyncrl.losses.arguments import check_positive
from lit_asyncrl.losses.base import Aggregation, LossStrategy, TokenTerms
from lit_asyncrl.losses.chunks import row_chunks
from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import LOG_RATIO_LIMIT
from lit_asyncrl.losses.registry import register_loss

# The histogram that brackets the cut: bins over [0, _HISTOGRAM_RANGE * bound].
_HISTOGRAM_BINS = 16384
_HISTOGRAM_RANGE = 64.0


def second_moment_mask(log_ratio: Tensor, valid: Tensor, second_moment_bound: float) -> Tensor:
    """Keep the largest token set with ``M2 = mean (log r)^2 <= bound``, dropping the largest ``(log r)^2``.

    M2PO removes the token with the largest ``(log r)^2`` until the batch ``M2`` is within the bound.
    Sorted ascending, the prefix means of ``(log r)^2`` never decrease, so the kept set is the longest
    prefix whose mean is within the bound (:func:`_sorted_selection`, the definition, on float64
    squares). Among equal ``(log r)^2`` at the cut, the earlier tokens (row-major order) are kept.

    The same selection without sorting the batch:

    1. when the batch ``M2`` is clearly within the bound, every valid token is kept;
    2. otherwise a histogram of ``(log r)^2`` brackets the cut in a window ``(low, high]``: the tokens
       up to ``low`` have a mean within the bound (all kept) and those up to ``high`` one above it
       (every token past ``high`` dropped). Only the tokens in the window are sorted; their prefix
       means continue the exact float64 sum of the tokens below ``low``;
    3. every claim of step 2 is checked on exact float64 sums with a margin larger than the rounding
       of either computation; if one fails (or a prefix mean lands within that margin of the bound),
       the full sort decides. The result is therefore the full sort's.

    Args:
        log_ratio: ``log r`` ``[B, T]``, detached.
        valid: bool ``[B, T]``.
        second_moment_bound: ``tau_M2``.

    Returns:
        bool ``[B, T]``, True on kept tokens.
    """
    if log_ratio.numel() == 0:
        return valid.clone()
    rows, length = log_ratio.shape
    unit = torch.finfo(log_ratio.dtype).eps / 2  # unit roundoff of the squares and their row sums
    eps64 = torch.finfo(torch.float64).eps
    # |error| of a sum of row sums <= ((length + 1) unit + rows eps64) * sum in any summation order;
    # the full sort's float64 prefix means carry <= numel eps64 more.
    margin = 2.0 * ((length + 2) * unit + (rows + log_ratio.numel()) * eps64)
    valid_count = int(count_true(valid))
    # 0 off valid.
    log_ratio = torch.where(valid, log_ratio, torch.zeros((), dtype=log_ratio.dtype, device=valid.device))
    total = torch.zeros((), dtype=torch.float64, device=valid.device)
    for _, squared, _ in _squares(log_ratio, valid, log_ratio.dtype):
        total += squared.view(-1, length).sum(dim=-1).to(torch.float64).sum()
    if float(total) <= second_moment_bound * (1.0 - margin) * valid_count:
        return valid.clone()
    low, high = _histogram_window(log_ratio, valid, valid_count, second_moment_bound)
    kept = _window_selection(log_ratio, valid, valid_count, low, high, second_moment_bound)
    return kept if kept is not None else _sorted_selection(log_ratio, valid, second_moment_bound)


def _squares(log_ratio: Tensor, valid: Tensor, dtype: torch.dtype) -> Iterator[tuple[slice, Tensor, Tensor]]:
    """Per row chunk: its slice, ``(log r)^2`` in ``dtype`` and ``valid``, both flat.

    The squares live in one buffer reused by every chunk (valid until the next chunk). In float64 the
    squares of float32 or float64 log-ratios are exact.
    """
    chunks = list(row_chunks(valid))
    length = valid.shape[1]
    buffer = torch.empty(max(part.stop - part.start for part in chunks) * length, dtype=dtype, device=valid.device)
    for part in chunks:
        chunk_valid = valid[part].reshape(-1)
        squared = buffer[: chunk_valid.numel()]
        squared.copy_(log_ratio[part].reshape(-1)).square_()
        yield part, squared, chunk_valid


def _histogram_window(log_ratio: Tensor, valid: Tensor, valid_count: int, bound: float) -> tuple[float, float]:
    """``(low, high)`` around the cut, from a histogram of the squares: a bin's tokens counted at its
    upper edge over-estimate every prefix sum, at its lower edge under-estimate it. ``low`` is the
    last edge whose over-estimated prefix mean fits the bound, ``high`` the first whose
    under-estimated one exceeds it (inf if none does). Only a guess: :func:`_window_selection` checks.
    """
    width = _HISTOGRAM_RANGE * bound / _HISTOGRAM_BINS
    counts = torch.zeros(_HISTOGRAM_BINS + 1, dtype=torch.long, device=valid.device)
    bins = None
    for _, squared, _ in _squares(log_ratio, valid, log_ratio.dtype):
        # bin floor(square / width), the squares past the range in one more bin (not used below);
        # int16 bins and bincount cost a fraction of torch.histc
        bins = torch.empty(squared.shape, dtype=torch.int16, device=valid.device) if bins is None else bins
        chunk_bins = bins[: squared.numel()]
        chunk_bins.copy_(squared.mul_(1.0 / width).clamp_(max=_HISTOGRAM_BINS))
        counts += torch.bincount(chunk_bins, minlength=_HISTOGRAM_BINS + 1)
    counts = counts[:_HISTOGRAM_BINS].to(torch.float64)
    counts[0] -= valid.numel() - valid_count  # the zeros of the invalid tokens
    edges = torch.arange(_HISTOGRAM_BINS + 1, dtype=torch.float64, device=counts.device) * width
    tokens = torch.cumsum(counts, dim=0)
    fits = torch.cumsum(counts * edges[1:], dim=0) <= bound * tokens  # a prefix of the bins
    exceeds = torch.cumsum(counts * edges[:-1], dim=0) > bound * tokens  # a suffix of the bins
    low = int(fits.sum()) * width
    above = int(exceeds.sum())
    return low, (_HISTOGRAM_BINS - above + 1) * width if above else torch.inf


def _window_selection(
    log_ratio: Tensor, valid: Tensor, valid_count: int, low: float, high: float, bound: float
) -> Tensor | None:
    """The selection if the tokens with ``(log r)^2 <= low`` all fit and the cut lies in ``(low, high]``;
    None when the exact float64 sums do not show both clearly (then the full sort decides)."""
    kept = torch.empty_like(valid)
    clamped_sum = torch.zeros((), dtype=torch.float64, device=valid.device)  # sum of min(square, low)
    above_count = torch.zeros((), dtype=torch.long, device=valid.device)  # tokens with square > low
    window_index = []
    window_squared = []
    masks = None
    length = valid.shape[1]
    for part, squared, chunk_valid in _squares(log_ratio, valid, torch.float64):
        n = squared.numel()
        masks = torch.empty(2, n, dtype=torch.bool, device=valid.device) if masks is None else masks
        above = masks[0, :n]
        window = masks[1, :n]
        torch.gt(squared, low, out=above)  # False off valid (0 there, low >= 0)
        torch.logical_not(above, out=kept[part].view(-1)).logical_and_(chunk_valid)  # below low: kept
        above_count += count_true(above)
        index = torch.le(squared, high, out=window).logical_and_(above).nonzero().squeeze(1)
        window_squared.append(squared[index])
        window_index.append(index + part.start * length)
        clamped_sum += squared.clamp_(max=low).sum()
    index = torch.cat(window_index)
    window_squared = torch.cat(window_squared)
    above_count = int(above_count)
    clamped_sum = float(clamped_sum)
    base_sum = clamped_sum - low * above_count  # the tokens below low (every other one adds low)
    base_count = valid_count - above_count
    # float64 rounding of the sums (numel eps each, relative to clamped_sum, which the subtraction
    # may leave larger than base_sum) and of the full sort's prefix means, with room to spare
    eps64 = torch.finfo(torch.float64).eps
    margin = 8.0 * (log_ratio.numel() + 2) * eps64 * max(1.0, clamped_sum / max(base_sum, 1e-300))
    if not base_sum <= bound * (1.0 - margin) * base_count:
        return None
    # the stable sort keeps the earlier token first among equal squares
    sorted_squared, order = torch.sort(window_squared, stable=True)
    positions = torch.arange(1, index.numel() + 1, device=valid.device, dtype=torch.float64) + base_count
    prefix_mean = (base_sum + torch.cumsum(sorted_squared, dim=0)) / positions  # [W]
    kept_count = int((prefix_mean <= bound).sum())
    if kept_count > 0 and not bool(prefix_mean[kept_count - 1] <= bound * (1.0 - margin)):
        return None
    if kept_count < index.numel():
        if not bool(prefix_mean[kept_count] > bound * (1.0 + margin)):
            return None
    elif base_count + index.numel() < valid_count:  # every window token kept, tokens above high remain
        return None
    kept.view(-1)[index[order[:kept_count]]] = True
    return kept


def _sorted_selection(log_ratio: Tensor, valid: Tensor, second_moment_bound: float) -> Tensor:
    """The definition: one stable sort of the batch's float64 ``(log r)^2``, kept while the prefix mean fits."""
    squared = torch.where(valid, log_ratio.to(torch.float64).square(), torch.inf).reshape(-1)  # [B*T]
    sorted_squared, order = torch.sort(squared, stable=True)
    positions = torch.arange(1, squared.numel() + 1, device=squared.device, dtype=torch.float64)
    prefix_mean = torch.cumsum(sorted_squared, dim=0) / positions  # inf past the last valid token
    kept_count = (prefix_mean <= second_moment_bound).sum()
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return (rank < kept_count).reshape(valid.shape) & valid


@register_loss("m2po")
class M2PO(LossStrategy):
    """``M_M2 * r A`` with ``r = pi_theta / pi_ref`` (``mu_old`` without a reference), no clipping.

    The mask ``M_M2`` (:func:`second_moment_mask`) replaces PPO's clip; ``clip_mask`` is that mask.

    Args:
        second_moment_bound: ``tau_M2 > 0`` on the batch mean of ``(log r)^2``; 0.04 in the paper.
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    reference_use = "optional"

    def __init__(
        self,
        *,
        second_moment_bound: float = 0.04,
        aggregation: Aggregation = "token_mean",
        normalizer: float | None = None,
    ) -> None:
        super().__init__(aggregation=aggregation, normalizer=normalizer)
        self.second_moment_bound = check_positive("second_moment_bound", second_moment_bound)

    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        log_ratio = (inputs.logprobs - inputs.anchor_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # [B, T]
        kept = second_moment_mask(log_ratio.detach(), inputs.valid, self.second_moment_bound)  # [B, T]
        policy_ratio = torch.exp(log_ratio)  # = ratio(logprobs, anchor): the same clamped log-ratio
        objective = torch.where(kept, policy_ratio * inputs.advantages, 0.0)
        return TokenTerms(objective=objective, discrepancy_mask=None, clip_mask=kept)
