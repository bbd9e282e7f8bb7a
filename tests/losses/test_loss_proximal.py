"""linear_prox / loglinear_prox (with and without the train-infer mask), hand-computed.

``r = pi_theta/mu_old``; ``alpha = 1/(n+1)``; clip (0.8, 1.2), discrepancy (0.8, 1.25).
"""

import pytest

from tests.support.losses import assert_close, assert_mask, inputs_from_ratios, run

# log-linear: r_s = r^alpha, r_d = r^(1-alpha)
# t0: n=1 (alpha 1/2), r=1.21   -> r_s 1.1,   r_d 1.1    A=1   inside             1.1
# t1: n=1,             r=1.69   -> r_s 1.3,   r_d 1.3    A=1   clipped at 1.2     1.2
# t2: n=3 (alpha 1/4), r=1.4641 -> r_s 1.1,   r_d 1.331  A=-2  inside             -2.2
# t3: n=0 (alpha 1),   r=0.9    -> r_s 0.9,   r_d 1      A=-1  inside             -0.9
LOGLINEAR_RATIOS = [1.21, 1.69, 1.4641, 0.9]
ADVANTAGES = [1.0, 1.0, -2.0, -1.0]
GAPS = [1, 1, 3, 0]


def test_loglinear_prox():
    out, grad = run("loglinear_prox", inputs_from_ratios(LOGLINEAR_RATIOS, ADVANTAGES, version_gap=GAPS),
                    clip_bounds=(0.8, 1.2))  # fmt: skip
    assert_close(out.loss, -(1.1 + 1.2 - 2.2 - 0.9) / 4)
    # pi_prox is detached: d(r_s A)/d log pi = r_s A
    assert_close(grad, [-1.1 / 4, 0.0, 2.2 / 4, 0.9 / 4])
    assert_mask(out.clip_mask, [True, False, True, True])
    assert out.metrics["train_infer_mask"] == 1.0  # r_d = 1 in Table 1: no mask


def test_loglinear_prox_train_infer():
    # r_d mask (0.8, 1.25) drops t1 (1.3) and t2 (1.331); kept tokens weighted by sg(r_d):
    # t0: 1.1 * 1.1 = 1.21 (grad 1.21), t3: 1 * -0.9 (grad -0.9)
    out, grad = run("loglinear_prox_train_infer", inputs_from_ratios(LOGLINEAR_RATIOS, ADVANTAGES, version_gap=GAPS),
                    discrepancy_bounds=(0.8, 1.25), clip_bounds=(0.8, 1.2))  # fmt: skip
    assert_close(out.loss, -(1.21 - 0.9) / 4)
    assert_close(grad, [-1.21 / 4, 0.0, 0.0, 0.9 / 4])
    assert_mask(out.discrepancy_mask, [True, False, False, True])
    assert out.metrics["train_infer_mask"] == pytest.approx(0.5)


def test_loglinear_prox_fixed_alpha_needs_no_version_gap():
    # alpha = 1/2 for every token: r = 1.21 -> r_s = 1.1; r = 0.64 -> r_s = 0.8 avoided, use 0.81 -> 0.9
    out, grad = run("loglinear_prox", inputs_from_ratios([1.21, 0.81], [1.0, -1.0]), alpha=0.5, clip_bounds=(0.8, 1.2))
    assert_close(out.loss, -(1.1 - 0.9) / 2)
    assert_close(grad, [-1.1 / 2, 0.9 / 2])


def test_interpolation_without_gap_or_alpha_is_an_error():
    with pytest.raises(ValueError, match="version_gap"):
        run("linear_prox", inputs_from_ratios([1.0], [1.0]))


# linear: r_d = alpha + (1-alpha) r, r_s = r / r_d
# t0: n=1 (1/2), r=1.4 -> r_d 1.2, r_s 7/6        A=1   inside          7/6
# t1: n=1,       r=3   -> r_d 2,   r_s 1.5        A=1   clipped at 1.2  1.2
# t2: n=3 (1/4), r=0.6 -> r_d 0.7, r_s 6/7        A=-1  inside          -6/7
# t3: n=0 (1),   r=0.5 -> r_d 1,   r_s 0.5        A=-1  clipped at 0.8  -0.8
LINEAR_RATIOS = [1.4, 3.0, 0.6, 0.5]
LINEAR_ADVANTAGES = [1.0, 1.0, -1.0, -1.0]


def test_linear_prox():
    out, grad = run("linear_prox", inputs_from_ratios(LINEAR_RATIOS, LINEAR_ADVANTAGES, version_gap=GAPS),
                    clip_bounds=(0.8, 1.2))  # fmt: skip
    assert_close(out.loss, -(7 / 6 + 1.2 - 6 / 7 - 0.8) / 4)
    assert_close(grad, [-(7 / 6) / 4, 0.0, (6 / 7) / 4, 0.0])
    assert_mask(out.clip_mask, [True, False, True, False])


def test_linear_prox_train_infer():
    # mask (0.8, 1.25) keeps t0 (1.2) and t3 (1); drops t1 (2) and t2 (0.7).
    # t0: sg(1.2) * 7/6 = 1.4, grad 1.4; t3: 1 * -0.8, no gradient
    out, grad = run("linear_prox_train_infer", inputs_from_ratios(LINEAR_RATIOS, LINEAR_ADVANTAGES, version_gap=GAPS),
                    discrepancy_bounds=(0.8, 1.25), clip_bounds=(0.8, 1.2))  # fmt: skip
    assert_close(out.loss, -(1.4 - 0.8) / 4)
    assert_close(grad, [-1.4 / 4, 0.0, 0.0, 0.0])
    assert_mask(out.discrepancy_mask, [True, False, False, True])
