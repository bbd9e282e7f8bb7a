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
SHAPES = st.tuples(st.integers(1, 4), st.integers(1, 6))
LOGPROB = st.floats(-6.0, -0.01, allow_nan=False)
# no subnormal advantages: their gradient underflows to 0 without any mask involved
ADVANTAGE = st.one_of(st.just(0.0), st.floats(0.01, 3.0), st.floats(-3.0, -0.01))

# Strategies whose clip_mask means "the staleness term passes gradient" (CISPO and GPPO keep a
# gradient on clipped tokens by design and are excluded from the zero-gradient property).
GRADIENT_STOPPING = [name for name in available_losses() if name not in ("cispo", "gppo")]


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


@pytest.mark.parametrize("name", GRADIENT_STOPPING)
@SETTINGS
@given(inputs=batches())
def test_masked_or_clipped_tokens_get_zero_gradient(name, inputs):
    out, grad = loss_and_grad(name, inputs, **tight_kwargs(name))
    passing = out.discrepancy_mask & out.clip_mask  # [B, T]
    assert torch.all(grad[~passing] == 0)
    # and the others do receive gradient (unless their advantage is 0)
    assert torch.all(grad[passing & (inputs.advantages != 0)] != 0)


@pytest.mark.parametrize("name", available_losses())
@SETTINGS
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
@SETTINGS
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
