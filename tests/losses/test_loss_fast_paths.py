"""The fast implementations against plain reference ones: metrics (fused per-gap buckets, row chunks),
M2PO's selection (windowed, not a full sort), the input check (reductions, not a per-token test)."""

import math

import pytest
import torch

import lit_asyncrl.losses.chunks as chunks
import lit_asyncrl.losses.m2po as m2po
import lit_asyncrl.losses.metrics as metrics_module
from lit_asyncrl.losses import LossInputs, get_loss
from lit_asyncrl.losses.aggregation import count_true
from lit_asyncrl.losses.inputs import prepare_inputs
from lit_asyncrl.losses.metrics import GAP_BUCKETS, step_metrics
from lit_asyncrl.losses.ratios import LOG_RATIO_LIMIT


def random_inputs(seed, batch=12, length=16, dtype=torch.float64, max_gap=5, scale=0.2):
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, length)
    behavior = (-3.0 * torch.rand(shape, generator=generator)).to(dtype)
    return LossInputs(
        logprobs=(behavior + scale * torch.randn(shape, generator=generator).to(dtype)).requires_grad_(),
        behavior_logprobs=behavior,
        advantages=torch.randn(shape, generator=generator).to(dtype),
        loss_mask=torch.rand(shape, generator=generator) < 0.8,
        ref_logprobs=behavior + 0.1 * scale * torch.randn(shape, generator=generator).to(dtype),
        version_gap=torch.randint(0, max_gap, shape, generator=generator),
    )


def summary(log_ratio, kept, clipped):
    """The documented metrics of one set of tokens, in float64, from its own masked reductions."""
    tokens = float(log_ratio.numel())
    if tokens == 0:
        return None
    ratio = log_ratio.exp()
    return {
        "train_infer_mask": float(kept.sum()) / tokens,
        "ppo_clip_ratio": float(clipped.sum()) / tokens,
        "kl_k1": float(-log_ratio.mean()),
        "kl_k3": float((ratio - 1 - log_ratio).mean()),
        "ess": float(ratio.sum() ** 2 / (tokens * (ratio**2).sum())),
        "ratio_min": float(ratio.min()),
        "ratio_mean": float(ratio.mean()),
        "ratio_max": float(ratio.max()),
        "policy_tokens": tokens,
    }


def reference_metrics(inputs, discrepancy_mask, clip_mask):
    """A loop over the gap buckets with masked reductions (what the fused scatter replaces)."""
    valid = inputs.loss_mask
    log_ratio = (inputs.logprobs.detach() - inputs.behavior_logprobs).double().clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    kept = valid if discrepancy_mask is None else discrepancy_mask
    clipped = valid & ~clip_mask
    expected = summary(log_ratio[valid], kept[valid], clipped[valid])
    gap = inputs.version_gap.clamp(min=0)
    expected["version_gap_mean"] = float(gap[valid].double().mean())
    expected["version_gap_max"] = float(gap[valid].max())
    bucket = gap.clamp(max=len(GAP_BUCKETS) - 1)
    for index, name in enumerate(GAP_BUCKETS):
        mask = valid & (bucket == index)
        if mask.any():
            stats = summary(log_ratio[mask], kept[mask], clipped[mask])
            expected.update({f"{key}/{name}": value for key, value in stats.items()})
    return expected


@pytest.mark.parametrize("per_row", [False, True])  # the CPU scatter, and the accelerators' one
@pytest.mark.parametrize("chunk_tokens", [1 << 17, 48, 16])  # one chunk, and several (3 rows, 1 row)
@pytest.mark.parametrize("max_gap", [3, 5, 9])  # gaps <= 4 only (bucket = gap), and larger ones
@pytest.mark.parametrize("seed", range(3))
def test_fused_bucket_metrics_equal_a_per_bucket_loop(monkeypatch, per_row, chunk_tokens, max_gap, seed):
    monkeypatch.setattr(chunks, "CPU_CHUNK_TOKENS", chunk_tokens)
    monkeypatch.setattr(metrics_module, "PER_ROW_SCATTER", per_row)
    inputs = random_inputs(seed, max_gap=max_gap)
    if seed == 1:  # one row with large gaps among rows with small ones: both paths in one batch
        inputs.version_gap[:] = inputs.version_gap.clamp(max=4)
        inputs.version_gap[5] += 20
    prepared = prepare_inputs(inputs, use_reference=True)
    generator = torch.Generator().manual_seed(100 + seed)
    discrepancy_mask = (torch.rand(prepared.valid.shape, generator=generator) < 0.7) & prepared.valid
    clip_mask = (torch.rand(prepared.valid.shape, generator=generator) < 0.6) & prepared.valid
    for mask in (discrepancy_mask, None):
        metrics = step_metrics(prepared, mask, clip_mask)
        expected = reference_metrics(inputs, mask, clip_mask)
        expected["nonfinite_tokens"] = 0.0
        assert metrics.keys() == expected.keys()
        for key, value in expected.items():
            assert metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key


def test_metrics_do_not_depend_on_the_chunk_size(monkeypatch):
    # tokens are accumulated in the same order whatever the chunking: bit-identical, float32 included
    inputs = random_inputs(7, batch=24, length=32, dtype=torch.float32, max_gap=7)
    results = []
    for chunk_tokens in (1 << 17, 100, 32):
        monkeypatch.setattr(chunks, "CPU_CHUNK_TOKENS", chunk_tokens)
        results.append(get_loss("decoupled_ppo")(inputs).metrics)
    assert results[0] == results[1] == results[2]


def sorted_selection(log_ratio, valid, bound):
    """M2PO by its definition: sort the valid (log r)^2 (stable: earlier token first on ties), keep the
    longest prefix whose float64 mean is within the bound."""
    squared = log_ratio.double().square()[valid]  # row-major order
    order = torch.sort(squared, stable=True).indices
    prefix_mean = torch.cumsum(squared[order], 0) / torch.arange(1, squared.numel() + 1, dtype=torch.float64)
    kept_count = int((prefix_mean <= bound).sum())
    kept_valid = torch.zeros(squared.numel(), dtype=torch.bool)
    kept_valid[order[:kept_count]] = True
    kept = torch.zeros_like(valid)
    kept[valid] = kept_valid
    return kept


def m2po_cases():
    for seed in range(4):
        for dtype in (torch.float32, torch.float64):
            for bound in (0.04, 0.01, 0.002, 1e-4):
                yield seed, dtype, bound


@pytest.mark.parametrize(("seed", "dtype", "bound"), list(m2po_cases()))
@pytest.mark.parametrize("chunk_tokens", [1 << 17, 64])
def test_m2po_selection_equals_the_sorted_definition(monkeypatch, seed, dtype, bound, chunk_tokens):
    monkeypatch.setattr(chunks, "CPU_CHUNK_TOKENS", chunk_tokens)
    generator = torch.Generator().manual_seed(seed)
    shape = (16, 96)
    log_ratio = (0.1 * torch.randn(shape, generator=generator)).to(dtype)
    if seed % 2:  # many ties: a few distinct values, +-x giving the same square
        log_ratio = (0.05 * torch.randint(-3, 4, shape, generator=generator)).to(dtype)
    valid = torch.rand(shape, generator=generator) < 0.8
    assert torch.equal(m2po.second_moment_mask(log_ratio, valid, bound), sorted_selection(log_ratio, valid, bound))


@pytest.mark.parametrize("window", [(0.0, 0.0), (0.0, math.inf), (1.0, math.inf), (1e-6, 2e-6)])
def test_m2po_falls_back_to_the_full_sort_on_a_wrong_window(monkeypatch, window):
    # the histogram only guesses the window; a wrong guess must be caught by the exact checks
    monkeypatch.setattr(m2po, "_histogram_window", lambda *args: window)
    generator = torch.Generator().manual_seed(0)
    log_ratio = 0.1 * torch.randn(8, 64, generator=generator)
    valid = torch.rand(8, 64, generator=generator) < 0.9
    for bound in (0.005, 0.002):
        assert torch.equal(m2po.second_moment_mask(log_ratio, valid, bound), sorted_selection(log_ratio, valid, bound))


def test_m2po_keeps_every_token_of_a_batch_within_the_bound():
    log_ratio = torch.full((2, 3), 0.1)  # M2 = 0.01
    valid = torch.tensor([[True, True, False], [True, False, True]])
    assert torch.equal(m2po.second_moment_mask(log_ratio, valid, 0.04), valid)
    assert not m2po.second_moment_mask(log_ratio, valid, 0.005).any()  # every square above the bound


def fused_check(inputs):
    """The per-token check the reductions stand for: a token is usable iff the sum of its inputs is finite."""
    checked = inputs.logprobs.detach() + inputs.behavior_logprobs + inputs.advantages + inputs.ref_logprobs
    return torch.isfinite(checked)


@pytest.mark.parametrize(
    "values",
    [
        [0.0, 0.0, 0.0],  # nothing to mask
        [math.nan, 0.0, 0.0],
        [0.0, math.inf, 0.0],
        [-math.inf, 0.0, 0.0],
        [3e38, 3e38, 0.0],  # finite, but their sum overflows: masked, as the per-token check does
        [1e38, 1e38, 0.0],  # large (past max/4) and finite with a finite sum: kept
        [1e38, -1e38, 0.0],
    ],
)
def test_input_check_masks_the_tokens_the_per_token_check_masks(values):
    inputs = random_inputs(0, batch=2, length=3, dtype=torch.float32)
    with torch.no_grad():
        inputs.logprobs[1, 1] = values[0]
        inputs.behavior_logprobs[1, 1] = values[1]
        inputs.advantages[0, 2] = values[2]
    inputs.loss_mask[:] = True
    prepared = prepare_inputs(inputs, use_reference=True)
    finite = fused_check(inputs)
    assert torch.equal(prepared.valid, finite)
    assert int(prepared.nonfinite_tokens) == int((~finite).sum())


def test_count_true_equals_the_sum():
    mask = torch.rand(5, 7, generator=torch.Generator().manual_seed(0)) < 0.5
    assert int(count_true(mask)) == int(mask.sum())
    assert torch.equal(count_true(mask, dim=-1).long(), mask.sum(dim=-1))
    assert torch.equal(count_true(mask, dim=-1, keepdim=True).long(), mask.sum(dim=-1, keepdim=True))
    assert torch.equal(count_true(mask.t(), dim=0).long(), mask.t().sum(dim=0))  # non-contiguous
