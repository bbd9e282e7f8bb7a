"""Property tests (hypothesis) for the identities every strategy must keep."""

import inspect
import math

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis.extra.numpy import arrays

from lit_asyncrl.losses import LossInputs, available_losses, get_loss, loss_class

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: Tests run once per strategy (17 of them): fewer examples each, hundreds over the strategies.
PER_STRATEGY = settings(SETTINGS, max_examples=25)
#: Every token masked: what is drawn hardly matters (the mask is overwritten), so a few batches do.
FEW = settings(SETTINGS, max_examples=10)
SHAPES = st.tuples(st.integers(1, 4), st.integers(1, 6))
LOGPROB = st.floats(-6.0, -0.01, allow_nan=False)
# no subnormal advantages: their gradient underflows to 0 without any mask involved
ADVANTAGE = st.one_of(st.just(0.0), st.floats(0.01, 3.0), st.floats(-3.0, -0.01))


@st.composite
def batches(draw, shape=None):
    batch, length = draw(SHAPES) if shape is None else shape
    shape = (batch, length)
    behavior = draw(arrays(np.float64, shape, elements=LOGPROB))
    # pi and pi_ref near mu, so that every mask and clip branch is visited
    policy_shift = draw(arrays(np.float64, shape, elements=st.floats(-0.7, 0.7)))
    ref_shift = draw(arrays(np.float64, shape, elements=st.floats(-0.4, 0.4)))
    return LossInputs(
        logprobs=torch.tensor(behavior + policy_shift).requires_grad_(),
        behavior_logprobs=torch.tensor(behavior),
        advantages=torch.tensor(draw(arrays(np.float64, shape, elements=ADVANTAGE))),
        loss_mask=torch.tensor(draw(arrays(np.bool_, shape))),
        ref_logprobs=torch.tensor(behavior + ref_shift),
        version_gap=torch.tensor(draw(arrays(np.int64, shape, elements=st.integers(0, 6)))),
    )


BOUNDS = st.tuples(st.floats(0.5, 1.0), st.floats(1.0, 2.0))


def tight_kwargs(name):
    """Bounds that the drawn ratios cross often, so masks and clips are exercised both ways."""
    parameters = inspect.signature(loss_class(name)).parameters
    kwargs = {}  # interpolation strategies use alpha = 1/(n+1) from the drawn version gaps
    if "discrepancy_bounds" in parameters:
        kwargs["discrepancy_bounds"] = (0.8, 1.25)
    if "discrepancy_cap" in parameters:  # MIS: two-sided, so both rejections are exercised
        kwargs.update(discrepancy_floor=0.8, discrepancy_cap=1.25)
    if "clip_bounds" in parameters:
        kwargs["clip_bounds"] = (0.85, 1.15)
    return kwargs


def loss_and_grad(name, inputs, **kwargs):
    out = get_loss(name, **kwargs)(inputs)
    (grad,) = torch.autograd.grad(out.loss, inputs.logprobs, allow_unused=False)
    return out, grad


@SETTINGS
@given(inputs=batches(), clip_bounds=BOUNDS, discrepancy_bounds=BOUNDS,
       aggregation=st.sampled_from(["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]))  # fmt: skip
def test_decoupled_with_reference_equal_to_behaviour_is_ppo_clip(inputs, clip_bounds, discrepancy_bounds, aggregation):
    inputs.ref_logprobs = inputs.behavior_logprobs.clone()
    decoupled, decoupled_grad = loss_and_grad("decoupled_ppo", inputs, discrepancy_bounds=discrepancy_bounds,
                                              clip_bounds=clip_bounds, aggregation=aggregation)  # fmt: skip
    inputs.ref_logprobs = None
    ppo, ppo_grad = loss_and_grad("ppo_clip", inputs, clip_bounds=clip_bounds, aggregation=aggregation)
    torch.testing.assert_close(decoupled.loss, ppo.loss, atol=1e-12, rtol=0)
    torch.testing.assert_close(decoupled_grad, ppo_grad, atol=1e-12, rtol=0)
    assert torch.equal(decoupled.clip_mask, ppo.clip_mask)


@SETTINGS
@given(inputs=batches(), clip_bounds=BOUNDS, discrepancy_bounds=BOUNDS)
def test_icepop_is_decoupled_ppo_with_the_reports_defaults(inputs, clip_bounds, discrepancy_bounds):
    # IcePop's M(k) = k on [low, high], 0 outside, is decoupled PPO's mask times sg(r_d): same loss and gradient.
    kwargs = dict(discrepancy_bounds=discrepancy_bounds, clip_bounds=clip_bounds)
    icepop, icepop_grad = loss_and_grad("icepop", inputs, **kwargs)
    decoupled, decoupled_grad = loss_and_grad("decoupled_ppo", inputs, **kwargs)
    torch.testing.assert_close(icepop.loss, decoupled.loss, atol=1e-12, rtol=0)
    torch.testing.assert_close(icepop_grad, decoupled_grad, atol=1e-12, rtol=0)
    assert torch.equal(icepop.discrepancy_mask, decoupled.discrepancy_mask)


# ---- independent oracle for the masks --------------------------------------------------------------
# The expected masks are computed here from the raw inputs and the bounds, never from a LossOutput.
# Conventions (docs/losses.md "Notation and conventions", lit_asyncrl/losses/ratios.py):
#   r = pi_theta / mu_old = exp(logp - behaviour), r_d = pi_ref / mu_old = exp(ref - behaviour),
#   r_s = pi_theta / pi_ref = exp(logp - ref).
#   PPO clip by advantage sign, bounds INCLUSIVE: A >= 0 (A = 0 counts as positive) is inside iff
#   r_s <= high (clipped iff r_s > high); A < 0 is inside iff r_s >= low (clipped iff r_s < low).
#   Symmetric train-infer mask M_[low, high], INCLUSIVE on both ends: kept iff low <= r_d <= high.
#   Both reported masks are False on non-policy tokens (loss_mask False); all drawn inputs are finite.
# The drawn bounds stay away from 1.0, where r = exp(0) = 1 exactly would make an inclusive/exclusive
# tie depend on the last bit of the interpolation arithmetic; test_bounds_are_inclusive checks ties.
ORACLE_BOUNDS = st.tuples(st.floats(0.5, 0.99), st.floats(1.01, 2.0))
DUAL_CLIP_BOUND = 1.5  # r = pi/pi_ref reaches exp(1.1) = 3.0 in batches(), so the floor is crossed often
OPTIONAL_REFERENCE = {"ppo_clip", "dual_clip", "gspo", "cispo", "gppo", "m2po"}  # fall back to mu_old


def inside_trust_region(ratio, advantages, bounds):
    low, high = bounds
    return torch.where(advantages >= 0, ratio <= high, ratio >= low)


def inside_window(value, bounds):
    low, high = bounds
    return (value >= low) & (value <= high)


def row_mean(values, valid):
    """Mean over each row's policy tokens, ``[B, 1]`` (0 for a row without any: its masks are False)."""
    return torch.where(valid, values, 0.0).sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)


def oracle(name, inputs, clip_bounds, discrepancy_bounds):
    """``(discrepancy_mask, clip_mask, passing)`` from the inputs alone; ``passing``: the tokens whose
    gradient must be non-zero when ``A != 0`` (every other token must get exactly 0)."""
    logp = inputs.logprobs.detach()
    behaviour, advantages, valid = inputs.behavior_logprobs, inputs.advantages, inputs.loss_mask
    ref = inputs.ref_logprobs
    anchor = behaviour if ref is None else ref  # pi_ref, or mu_old where the reference is optional
    r = torch.exp(logp - behaviour)
    kept = valid  # no r_d mask: every policy token kept

    if name in ("ppo_clip", "gppo", "gspo", "cispo", "dual_clip"):
        ratio = torch.exp(logp - anchor)
        if name == "gspo":  # one ratio per sequence: the geometric mean of the token ratios
            ratio = torch.exp(row_mean(logp - anchor, valid)).expand_as(logp)
        inside = inside_trust_region(ratio, advantages, clip_bounds)
        if name == "cispo":  # "not clipped" is symmetric for CISPO: the weight clip(r) equals r
            inside = inside_window(ratio, clip_bounds)
        if name == "dual_clip":  # A < 0 is also floored above c: passes only while low <= r <= c
            inside = inside & ((advantages >= 0) | (ratio <= DUAL_CLIP_BOUND))
    elif name == "ppo_clip_train_infer":  # the whole r goes through the clip; pi_ref is ignored
        inside = inside_trust_region(r, advantages, clip_bounds)
    elif name in ("decoupled_ppo", "icepop", "tis_token", "tis_sequence", "mis_sequence", "mis_geometric"):
        inside = inside_trust_region(torch.exp(logp - ref), advantages, clip_bounds)
        log_discrepancy = ref - behaviour  # log r_d
        if name in ("decoupled_ppo", "icepop"):
            kept = valid & inside_window(torch.exp(log_discrepancy), discrepancy_bounds)
        elif name == "mis_sequence":  # rho = prod_t r_d,t over the row's policy tokens
            rho = torch.exp(torch.where(valid, log_discrepancy, 0.0).sum(-1, keepdim=True))
            kept = valid & inside_window(rho, discrepancy_bounds)
        elif name == "mis_geometric":  # geometric mean of r_d over the row's policy tokens
            kept = valid & inside_window(torch.exp(row_mean(log_discrepancy, valid)), discrepancy_bounds)
        # tis_*: truncation min(rho, C) only re-weights (rho > 0), it drops nothing
    else:  # interpolated proximal policy, alpha = 1/(n+1) is the weight of mu_old
        alpha = 1.0 / (inputs.version_gap.to(r.dtype) + 1.0)
        if name.startswith("loglinear_prox"):  # log pi_prox = alpha log mu + (1 - alpha) log pi
            proximal_over_behaviour = r ** (1.0 - alpha)
        else:  # linear_prox: pi_prox = alpha mu + (1 - alpha) pi
            proximal_over_behaviour = alpha + (1.0 - alpha) * r
        inside = inside_trust_region(r / proximal_over_behaviour, advantages, clip_bounds)  # r_s = pi/pi_prox
        if name.endswith("_train_infer"):  # r_d = pi_prox / mu_old, masked symmetrically
            kept = valid & inside_window(proximal_over_behaviour, discrepancy_bounds)

    inside = inside & valid
    # CISPO and GPPO clip the weight, not the gradient: every kept policy token keeps a gradient.
    passing = kept if name in ("cispo", "gppo") else kept & inside
    return kept, inside, passing


ORACLE_NAMES = sorted(set(available_losses()) - {"m2po"})  # m2po: test_m2po_mask_is_the_greedy_removal


def test_every_strategy_has_an_independent_oracle():
    assert set(ORACLE_NAMES) | {"m2po"} == set(available_losses())
    # every branch of oracle() is a registered name (a typo would silently fall into the last branch)
    assert {n for n in ORACLE_NAMES if "prox" in n} == {
        "linear_prox", "linear_prox_train_infer", "loglinear_prox", "loglinear_prox_train_infer"
    }  # fmt: skip


@pytest.mark.parametrize("name", ORACLE_NAMES)
@PER_STRATEGY
@given(inputs=batches(), clip_bounds=ORACLE_BOUNDS, discrepancy_bounds=ORACLE_BOUNDS, drop_reference=st.booleans(),
       one_sided=st.booleans())  # fmt: skip
def test_masks_and_zero_gradients_match_an_oracle_computed_from_the_inputs(
    name, inputs, clip_bounds, discrepancy_bounds, drop_reference, one_sided
):
    if drop_reference and name in OPTIONAL_REFERENCE:
        inputs.ref_logprobs = None
    parameters = inspect.signature(loss_class(name)).parameters
    kwargs = {"clip_bounds": clip_bounds}
    if "discrepancy_bounds" in parameters:
        kwargs["discrepancy_bounds"] = discrepancy_bounds
    if "discrepancy_cap" in parameters:  # MIS: one-sided (no floor, the default) or two-sided
        kwargs["discrepancy_cap"] = discrepancy_bounds[1]
        if one_sided:
            discrepancy_bounds = (0.0, discrepancy_bounds[1])  # a ratio is > 0: no lower rejection
        else:
            kwargs["discrepancy_floor"] = discrepancy_bounds[0]
    if "dual_clip_bound" in parameters:
        kwargs["dual_clip_bound"] = DUAL_CLIP_BOUND
    out, grad = loss_and_grad(name, inputs, **kwargs)
    kept, inside, passing = oracle(name, inputs, clip_bounds, discrepancy_bounds)

    assert torch.equal(out.discrepancy_mask, kept)
    assert torch.equal(out.clip_mask, inside)
    assert torch.all(grad[~passing] == 0)  # masked, clipped, floored and non-policy tokens
    assert torch.all(grad[passing & (inputs.advantages != 0)] != 0)  # and only those


@SETTINGS
@given(inputs=batches(), drop_reference=st.booleans())
def test_m2po_mask_is_the_greedy_removal(inputs, drop_reference):
    """M2PO (tau = 0.04): drop the token with the largest (log r)^2 while the batch mean exceeds tau.

    Written as the paper's loop, not the implementation's sort and prefix mean. Ties in (log r)^2 at
    the cut may be broken either way, so the oracle fixes how many tokens are kept and that they are
    the smallest; the gradient is then zero exactly off that (checked) mask.
    """
    if drop_reference:
        inputs.ref_logprobs = None
    anchor = inputs.behavior_logprobs if inputs.ref_logprobs is None else inputs.ref_logprobs
    squared = (inputs.logprobs.detach() - anchor) ** 2  # (log r)^2, r = pi / pi_ref (or / mu_old)
    valid = inputs.loss_mask
    remaining = sorted(squared[valid].tolist())
    while remaining and sum(remaining) / len(remaining) > 0.04:
        remaining.pop()  # the largest

    out, grad = loss_and_grad("m2po", inputs, second_moment_bound=0.04)
    kept = out.clip_mask
    assert torch.equal(out.discrepancy_mask, valid)  # no r_d mask
    assert not (kept & ~valid).any()
    assert int(kept.sum()) == len(remaining)
    dropped = valid & ~kept
    if kept.any() and dropped.any():
        assert squared[kept].max() <= squared[dropped].min()
    assert torch.all(grad[~kept] == 0)
    assert torch.all(grad[kept & (inputs.advantages != 0)] != 0)


@pytest.mark.parametrize(
    ("name", "advantage", "bounds", "inside"),
    [
        ("ppo_clip", 1.0, {"clip_bounds": (0.8, 1.0)}, True),  # A >= 0: r_s = high passes
        ("ppo_clip", -1.0, {"clip_bounds": (1.0, 1.2)}, True),  # A < 0: r_s = low passes
        ("ppo_clip", 0.0, {"clip_bounds": (1.0, 1.0)}, True),  # A = 0 is positive: r_s = high passes
        ("decoupled_ppo", 1.0, {"discrepancy_bounds": (1.0, 1.0), "clip_bounds": (1.0, 1.0)}, True),
    ],
)
def test_bounds_are_inclusive(name, advantage, bounds, inside):
    # pi_theta = pi_ref = mu_old exactly, so r_s = r_d = exp(0) = 1.0 lies exactly on the bound
    behaviour = torch.tensor([[-1.0]], dtype=torch.float64)
    inputs = LossInputs(logprobs=behaviour.clone().requires_grad_(), behavior_logprobs=behaviour,
                        advantages=torch.tensor([[advantage]], dtype=torch.float64),
                        loss_mask=torch.ones((1, 1), dtype=torch.bool), ref_logprobs=behaviour.clone())  # fmt: skip
    out, grad = loss_and_grad(name, inputs, **bounds)
    assert out.discrepancy_mask.item() is True and out.clip_mask.item() is inside
    # and one step past the bound, r_s = exp(+-1e-9), the token is clipped (gradient 0)
    with torch.no_grad():
        inputs.logprobs += 1e-9 if advantage >= 0 else -1e-9
    out, grad = loss_and_grad(name, inputs, **bounds)
    assert out.clip_mask.item() is False and grad.item() == 0.0


@pytest.mark.parametrize("name", available_losses())
@FEW
@given(inputs=batches())
def test_all_masked_gives_zero_loss_and_zero_gradient(name, inputs):
    inputs.loss_mask = torch.zeros_like(inputs.loss_mask)
    inputs.logprobs.data[0, 0] = math.nan  # garbage outside the mask must not leak either
    out, grad = loss_and_grad(name, inputs, **tight_kwargs(name))
    assert out.loss.item() == 0.0
    assert torch.all(grad == 0)
    assert all(math.isfinite(value) for value in out.metrics.values())
    assert not out.discrepancy_mask.any() and not out.clip_mask.any()


NONFINITE = st.sampled_from([math.nan, math.inf, -math.inf])


@pytest.mark.parametrize("name", available_losses())
@PER_STRATEGY
@given(inputs=batches(), data=st.data())
def test_nonfinite_inputs_are_masked_and_counted(name, inputs, data):
    shape = inputs.loss_mask.shape
    corrupt = torch.tensor(data.draw(arrays(np.bool_, shape)))  # [B, T]
    field = data.draw(st.sampled_from(["logprobs", "behavior_logprobs", "ref_logprobs", "advantages"]))
    value = data.draw(NONFINITE)
    kwargs = tight_kwargs(name)

    # the same batch with the corrupted tokens simply left out of the loss
    clean_inputs = LossInputs(inputs.logprobs.detach().clone().requires_grad_(), inputs.behavior_logprobs,
                              inputs.advantages, inputs.loss_mask & ~corrupt, inputs.ref_logprobs,
                              inputs.version_gap)  # fmt: skip
    strategy = get_loss(name, **kwargs)
    if field == "ref_logprobs" and strategy.reference_use == "ignored":
        clean_inputs.loss_mask = inputs.loss_mask  # an unused reference is not inspected
    clean, clean_grad = loss_and_grad(name, clean_inputs, **kwargs)

    tensor = getattr(inputs, field)
    with torch.no_grad():
        tensor[corrupt] = value
    out, grad = loss_and_grad(name, inputs, **kwargs)

    assert torch.isfinite(out.loss) and torch.all(torch.isfinite(grad))
    torch.testing.assert_close(out.loss, clean.loss, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad, clean_grad, atol=1e-12, rtol=0)
    expected = (inputs.loss_mask & ~clean_inputs.loss_mask).sum().item()
    assert out.metrics["nonfinite_tokens"] == expected
