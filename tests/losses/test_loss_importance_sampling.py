"""TIS (token, sequence), IcePop and sequence MIS (product, geometric mean), hand-computed.

All use ``r_d = pi_ref/mu_old`` and ``r_s = pi_theta/pi_ref`` with clip (0.8, 1.2).
"""

import pytest

from loss_test_helpers import assert_close, assert_mask, inputs_from_ratios, run


def decoupled(discrepancy, staleness, advantages, loss_mask=None):
    def times(d_row, s_row):
        return [d * s for d, s in zip(d_row, s_row)]

    if isinstance(discrepancy[0], list):
        total = [times(d, s) for d, s in zip(discrepancy, staleness)]
    else:
        total = times(discrepancy, staleness)
    return inputs_from_ratios(total, advantages, reference_ratio=discrepancy, loss_mask=loss_mask)


def test_tis_token_truncates_weight():
    # t0: r_d 3   -> w 2   , r_s 1.1, A=1  -> 2.2 (grad 2.2)
    # t1: r_d 0.5 -> w 0.5 , r_s 0.9, A=-2 -> -0.9 (grad -0.9)
    # t2: r_d 1.5 -> w 1.5 , r_s 1.5, A=1  -> 1.5 * 1.2 = 1.8 (clipped, no gradient)
    inputs = decoupled([3.0, 0.5, 1.5], [1.1, 0.9, 1.5], [1.0, -2.0, 1.0])
    out, grad = run("tis_token", inputs, clip_bounds=(0.8, 1.2), weight_cap=2.0)
    assert_close(out.loss, -(2.2 - 0.9 + 1.8) / 3)
    assert_close(grad, [-2.2 / 3, 0.9 / 3, 0.0])
    assert_mask(out.discrepancy_mask, [True, True, True])  # truncation drops nothing


def test_tis_sequence_truncates_product_over_valid_tokens():
    # row 0: r_d 2 * 1.5 = 3 -> w 2; row 1: 0.5 * 1.2 = 0.6 -> w 0.6; third token padding (r_d 100).
    # r_s = 1.1 everywhere: row 0 A=(1,1) -> 2.2, 2.2; row 1 A=(1,-1) -> 0.66, -0.66
    inputs = decoupled(
        [[2.0, 1.5, 100.0], [0.5, 1.2, 100.0]],
        [[1.1, 1.1, 1.1], [1.1, 1.1, 1.1]],
        [[1.0, 1.0, 1.0], [1.0, -1.0, 1.0]],
        loss_mask=[[True, True, False], [True, True, False]],
    )
    out, grad = run("tis_sequence", inputs, clip_bounds=(0.8, 1.2), weight_cap=2.0)
    assert_close(out.loss, -(2.2 + 2.2 + 0.66 - 0.66) / 4)
    assert_close(grad, [[-2.2 / 4, -2.2 / 4, 0.0], [-0.66 / 4, 0.66 / 4, 0.0]])


def test_icepop_masks_without_reweighting():
    # bounds (0.5, 2): t0 r_d 1.5 kept, r_s 1.1, A=1 -> 1.1 (grad 1.1; no r_d weight)
    # t1 r_d 3 dropped; t2 r_d 0.4 dropped; t3 r_d 0.6 kept, r_s 0.5, A=-1 -> -0.8 clipped
    inputs = decoupled([1.5, 3.0, 0.4, 0.6], [1.1, 1.0, 1.0, 0.5], [1.0, 1.0, 1.0, -1.0])
    out, grad = run("icepop", inputs, discrepancy_bounds=(0.5, 2.0), clip_bounds=(0.8, 1.2))
    assert_close(out.loss, -(1.1 - 0.8) / 4)
    assert_close(grad, [-1.1 / 4, 0.0, 0.0, 0.0])
    assert_mask(out.discrepancy_mask, [True, False, False, True])
    assert out.metrics["train_infer_mask"] == pytest.approx(0.5)


def test_mis_sequence_rejects_and_reweights_by_product():
    # row 0: rho = 1.2 * 1.5 = 1.8 kept, weight 1.8; r_s (1.1, 1.0), A (1, -1) -> 1.98, -1.8
    # row 1: rho = 2 * 1.5 = 3 rejected
    inputs = decoupled([[1.2, 1.5], [2.0, 1.5]], [[1.1, 1.0], [1.0, 1.0]], [[1.0, -1.0], [1.0, 1.0]])
    out, grad = run("mis_sequence", inputs, discrepancy_bounds=(0.5, 2.0), clip_bounds=(0.8, 1.2))
    assert_close(out.loss, -(1.98 - 1.8) / 4)
    assert_close(grad, [[-1.98 / 4, 1.8 / 4], [0.0, 0.0]])
    assert_mask(out.discrepancy_mask, [[True, True], [False, False]])


def test_mis_geometric_rejects_by_geometric_mean_only():
    # row 0: sqrt(4 * 0.81) = 1.8 kept although one token has r_d 4; no re-weighting
    # row 1: sqrt(3 * 3) = 3 rejected
    inputs = decoupled([[4.0, 0.81], [3.0, 3.0]], [[1.1, 1.0], [1.0, 1.0]], [[1.0, -1.0], [1.0, 1.0]])
    out, grad = run("mis_geometric", inputs, discrepancy_bounds=(0.5, 2.0), clip_bounds=(0.8, 1.2))
    assert_close(out.loss, -(1.1 - 1.0) / 4)
    assert_close(grad, [[-1.1 / 4, 1.0 / 4], [0.0, 0.0]])
    assert_mask(out.discrepancy_mask, [[True, True], [False, False]])
