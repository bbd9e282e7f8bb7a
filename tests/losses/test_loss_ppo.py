"""PPO-clip, PPO-clip & train_infer and dual-clip against hand-computed values (clip 0.8 / 1.2)."""

import pytest

from tests.support.losses import assert_close, assert_mask, inputs_from_ratios, run

# t0: r=1.1, A=2  inside            -> objective 2.2,  d/dlogp 2.2
# t1: r=1.5, A=1  clipped at 1.2    -> objective 1.2,  no gradient
# t2: r=0.5, A=-1 clipped at 0.8    -> objective -0.8, no gradient
# t3: r=0.9, A=-2 inside            -> objective -1.8, d/dlogp -1.8
# t4: padding (loss_mask False), ratio 7 must not matter
RATIOS = [1.1, 1.5, 0.5, 0.9, 7.0]
ADVANTAGES = [2.0, 1.0, -1.0, -2.0, 5.0]
MASK = [True, True, True, True, False]
EXPECTED_LOSS = -(2.2 + 1.2 - 0.8 - 1.8) / 4  # -0.2
EXPECTED_GRAD = [-2.2 / 4, 0.0, 0.0, 1.8 / 4, 0.0]


def test_ppo_clip_on_behaviour_without_reference():
    out, grad = run("ppo_clip", inputs_from_ratios(RATIOS, ADVANTAGES, loss_mask=MASK), clip_bounds=(0.8, 1.2))
    assert_close(out.loss, EXPECTED_LOSS)
    assert_close(grad, EXPECTED_GRAD)
    assert_mask(out.clip_mask, [True, False, False, True, False])
    assert_mask(out.discrepancy_mask, [True, True, True, True, False])
    assert out.metrics["ppo_clip_ratio"] == pytest.approx(0.5, abs=1e-12)
    assert out.metrics["train_infer_mask"] == 1.0


def test_ppo_clip_uses_reference_when_given():
    # pi/ref carries the ratios above; pi/mu is 3x larger and must not matter.
    ratios = [3 * r for r in RATIOS]
    inputs = inputs_from_ratios(ratios, ADVANTAGES, reference_ratio=[3.0] * 5, loss_mask=MASK)
    out, grad = run("ppo_clip", inputs, clip_bounds=(0.8, 1.2))
    assert_close(out.loss, EXPECTED_LOSS)
    assert_close(grad, EXPECTED_GRAD)


def test_ppo_clip_train_infer_ignores_reference():
    # Table 1: r_d = 1, r_s = pi_theta / mu_old even when a reference exists.
    inputs = inputs_from_ratios(RATIOS, ADVANTAGES, reference_ratio=[3.0] * 5, loss_mask=MASK)
    out, grad = run("ppo_clip_train_infer", inputs, clip_bounds=(0.8, 1.2))
    assert_close(out.loss, EXPECTED_LOSS)
    assert_close(grad, EXPECTED_GRAD)
    assert out.metrics["train_infer_mask"] == 1.0


def test_ppo_clip_asymmetric_bounds():
    # clip (0.9, 1.6): t1 (r=1.5, A=1) now inside -> 1.5 with gradient; t3 (r=0.9, A=-2) on the
    # boundary is avoided by using r=0.95 -> inside.
    out, grad = run("ppo_clip", inputs_from_ratios([1.5, 0.95, 0.5], [1.0, -2.0, -1.0]), clip_bounds=(0.9, 1.6))
    assert_close(out.loss, -(1.5 - 1.9 - 0.9) / 3)
    assert_close(grad, [-1.5 / 3, 1.9 / 3, 0.0])


def test_dual_clip_floors_negative_advantages():
    # c = 3:
    # t0: r=4,   A=-1 r > c: floored   -> objective -3,   no gradient
    # t1: r=2,   A=-1 low <= r <= c    -> objective -2,   d/dlogp -2
    # t2: r=1.5, A=1  clipped at 1.2   -> objective 1.2,  no gradient
    # t3: r=0.5, A=-1 clipped at 0.8   -> objective -0.8, no gradient
    inputs = inputs_from_ratios([4.0, 2.0, 1.5, 0.5], [-1.0, -1.0, 1.0, -1.0])
    out, grad = run("dual_clip", inputs, clip_bounds=(0.8, 1.2), dual_clip_bound=3.0)
    assert_close(out.loss, -(-3.0 - 2.0 + 1.2 - 0.8) / 4)
    assert_close(grad, [0.0, 2.0 / 4, 0.0, 0.0])
    assert_mask(out.clip_mask, [False, True, False, False])
