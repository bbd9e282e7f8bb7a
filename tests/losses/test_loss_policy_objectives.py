"""CISPO, GPPO, GSPO and M2PO against hand-computed values (ratio against mu_old, no reference)."""

import math

import pytest
import torch

from tests.support.losses import assert_close, assert_mask, inputs_from_ratios, run


def test_cispo_clips_the_weight_not_the_gradient():
    # weights clip(r, 0.8, 1.2) = (1.2, 0.8, 1.1); objective w A = (1.2, -0.8, 2.2), gradient w A too
    out, grad = run("cispo", inputs_from_ratios([1.5, 0.5, 1.1], [1.0, -1.0, 2.0]), clip_bounds=(0.8, 1.2))
    assert_close(out.loss, -(1.2 - 0.8 + 2.2) / 3)
    assert_close(grad, [-1.2 / 3, 0.8 / 3, -2.2 / 3])
    assert_mask(out.clip_mask, [False, False, True])


def test_gppo_keeps_a_bounded_gradient_on_clipped_tokens():
    # t0 A>0 r 1.5 > 1.2 -> value 1.2, grad 1.2 (PPO: 0)
    # t1 A<0 r 0.5 < 0.8 -> value -0.8, grad -0.8 (PPO: 0)
    # t2 A<0 r 1.5 -> -1.5; t3 A>0 r 0.5 -> 0.5; t4 A=2 r 1.1 -> 2.2: unclipped, grad = value
    ratios, advantages = [1.5, 0.5, 1.5, 0.5, 1.1], [1.0, -1.0, -1.0, 1.0, 2.0]
    out, grad = run("gppo", inputs_from_ratios(ratios, advantages), clip_bounds=(0.8, 1.2))
    expected = [1.2, -0.8, -1.5, 0.5, 2.2]
    assert_close(out.loss, -sum(expected) / 5)
    assert_close(grad, [-v / 5 for v in expected])
    assert_mask(out.clip_mask, [False, False, True, True, True])
    ppo, _ = run("ppo_clip", inputs_from_ratios(ratios, advantages), clip_bounds=(0.8, 1.2))
    assert_close(out.loss, ppo.loss)  # same value as PPO-clip, different gradient


def test_gspo_sequence_ratio():
    # row 0: token ratios (1.21, 1)   -> s = sqrt(1.21) = 1.1, A = (1, 1)   inside -> 1.1 each
    # row 1: token ratios (2.25, 1)   -> s = 1.5,              A = (-1, -1) inside -> -1.5 each
    # row 2: token ratios (1.5, 1.5)  -> s = 1.5,              A = (1, 1)   clipped -> 1.2, no grad
    # third token of each row is padding with ratio 9.
    inputs = inputs_from_ratios(
        [[1.21, 1.0, 9.0], [2.25, 1.0, 9.0], [1.5, 1.5, 9.0]],
        [[1.0, 1.0, 1.0], [-1.0, -1.0, 1.0], [1.0, 1.0, 1.0]],
        loss_mask=[[True, True, False]] * 3,
    )
    out, grad = run("gspo", inputs, clip_bounds=(0.8, 1.2))  # default: seq_mean_token_mean
    assert_close(out.loss, -(1.1 - 1.5 + 1.2) / 3)
    # d/dlogp_t of (1/3) * (1/2) sum_t s A_t  = s A_t / 6
    assert_close(grad, [[-1.1 / 6, -1.1 / 6, 0.0], [1.5 / 6, 1.5 / 6, 0.0], [0.0, 0.0, 0.0]])
    assert_mask(out.clip_mask, [[True, True, False], [True, True, False], [False, False, False]])


def test_gspo_gradient_equals_the_sequence_objective():
    """GSPO-token with a sequence advantage gives the gradient of -mean_i min(s_i A_i, clip(s_i) A_i)."""
    generator = torch.Generator().manual_seed(0)
    logprobs = (torch.randn(4, 6, generator=generator, dtype=torch.float64) * 0.05 - 1).requires_grad_()
    behavior = logprobs.detach() + 0.05 * torch.randn(4, 6, generator=generator, dtype=torch.float64)
    advantages = torch.tensor([[1.0], [-1.0], [2.0], [-0.5]], dtype=torch.float64).expand(4, 6)
    mask = torch.ones(4, 6, dtype=torch.bool)
    from lit_asyncrl.losses import LossInputs, get_loss

    out = get_loss("gspo", clip_bounds=(0.98, 1.02))(LossInputs(logprobs, behavior, advantages, mask))
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    s = torch.exp((logprobs - behavior).mean(dim=-1))  # [B]
    a = advantages[:, 0]
    reference = -torch.minimum(s * a, s.clamp(0.98, 1.02) * a).mean()
    (reference_grad,) = torch.autograd.grad(reference, logprobs)
    assert_close(out.loss, reference, tol=1e-12)
    assert_close(grad, reference_grad, tol=1e-12)


def test_m2po_drops_largest_squared_log_ratios_until_second_moment_fits():
    # (log r)^2 = (0.01, 0.01, 0.09, 0.25); prefix means 0.01, 0.01, 0.0367, 0.09 -> keep 3 (tau 0.04)
    log_ratios = [0.1, -0.1, 0.3, 0.5]
    advantages = [1.0, -1.0, 2.0, 1.0]
    inputs = inputs_from_ratios([math.exp(x) for x in log_ratios], advantages)
    out, grad = run("m2po", inputs, second_moment_bound=0.04)
    kept = [math.exp(0.1) * 1.0, math.exp(-0.1) * -1.0, math.exp(0.3) * 2.0]  # r A, unclipped
    assert_close(out.loss, -sum(kept) / 4)
    assert_close(grad, [-kept[0] / 4, -kept[1] / 4, -kept[2] / 4, 0.0])
    assert_mask(out.clip_mask, [True, True, True, False])
    assert out.metrics["ppo_clip_ratio"] == pytest.approx(0.25)


def test_m2po_keeps_everything_within_the_bound():
    out, grad = run("m2po", inputs_from_ratios([1.1, 0.9], [1.0, 1.0]), second_moment_bound=0.04)
    assert_close(out.loss, -(1.1 + 0.9) / 2)
    assert_close(grad, [-1.1 / 2, -0.9 / 2])
