"""Input validation and dtypes."""

import pytest
import torch

from lit_asyncrl.losses import LossInputs, get_loss
from tests.support.losses import assert_close, inputs_from_ratios, run


def test_float32_and_bfloat16_inputs():
    inputs = inputs_from_ratios([1.1, 0.9], [1.0, -1.0], version_gap=[1, 2])
    for dtype, expected in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32)):
        inputs.logprobs = inputs.logprobs.detach().to(dtype).requires_grad_()
        inputs.behavior_logprobs = inputs.behavior_logprobs.to(dtype)
        out, grad = run("loglinear_prox_train_infer", inputs)
        assert out.loss.dtype == expected
        assert grad.dtype == dtype


def test_shape_mismatch_names_the_field():
    inputs = inputs_from_ratios([1.0, 1.0], [1.0, 1.0])
    inputs.advantages = torch.ones(1, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="advantages"):
        get_loss("ppo_clip")(inputs)


def test_logprobs_must_be_two_dimensional():
    logprobs = torch.zeros(4, requires_grad=True)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        get_loss("ppo_clip")(LossInputs(logprobs, torch.zeros(4), torch.zeros(4), torch.ones(4, dtype=torch.bool)))


def test_float_loss_mask_is_accepted():
    inputs = inputs_from_ratios([1.1, 0.9], [1.0, 1.0], loss_mask=[True, False])
    inputs.loss_mask = inputs.loss_mask.double()
    out, grad = run("ppo_clip", inputs)
    assert_close(out.loss, -1.1)
    assert_close(grad, [-1.1, 0.0])


def test_negative_version_gap_counts_as_zero():
    # alpha = 1/(0+1) = 1: pi_prox = mu_old, r_s = r
    out, grad = run("loglinear_prox", inputs_from_ratios([1.1], [1.0], version_gap=[-2]))
    assert_close(out.loss, -1.1)
    assert_close(grad, [-1.1])
