"""TIS (token, sequence), IcePop and sequence MIS (product, geometric mean), hand-computed.

All use ``r_d = pi_ref/mu_old`` and ``r_s = pi_theta/pi_ref`` with clip (0.8, 1.2).
"""

import math

import pytest

from lit_asyncrl.losses import get_loss
from tests.support.losses import assert_close, assert_mask, inputs_from_ratios, run


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


def test_icepop_reweights_kept_tokens_by_the_discrepancy_ratio():
    # Ring-1T report (IcePop): M(k) * min(r_s A, clip(r_s) A) with k = r_d = pi_ref / mu_old and
    # M(k) = k inside [low, high], 0 outside; k is a constant (no gradient). Bounds (0.5, 2):
    # t0 k 1.5 kept, r_s 1.1, A=1   -> 1.5 * 1.1 = 1.65       (grad 1.65)
    # t1 k 3   dropped; t2 k 0.4 dropped                        (0, grad 0)
    # t3 k 0.6 kept, r_s 0.5, A=-1  -> 0.6 * 0.8 * -1 = -0.48   (clipped, grad 0)
    # t4 k 0.8 kept, r_s 0.9, A=-2  -> 0.8 * 0.9 * -2 = -1.44   (grad -1.44)
    # token mean over 5: loss = -(1.65 - 0.48 - 1.44) / 5 = 0.054 (without the k weight it was 0.3)
    inputs = decoupled([1.5, 3.0, 0.4, 0.6, 0.8], [1.1, 1.0, 1.0, 0.5, 0.9], [1.0, 1.0, 1.0, -1.0, -2.0])
    inputs.ref_logprobs = inputs.ref_logprobs.clone().requires_grad_()  # k must not pass gradient to pi_ref
    out, grad = run("icepop", inputs, discrepancy_bounds=(0.5, 2.0), clip_bounds=(0.8, 1.2))
    assert_close(out.loss, 0.054)
    assert_close(grad, [-1.65 / 5, 0.0, 0.0, 0.0, 1.44 / 5])
    assert inputs.ref_logprobs.grad is None
    assert_mask(out.discrepancy_mask, [True, False, False, True, True])
    assert_mask(out.clip_mask, [True, True, True, False, True])
    assert out.metrics["train_infer_mask"] == pytest.approx(0.6)


def test_icepop_default_mask_is_the_reports_half_to_five():
    # k = 0.49 and 5.01 dropped, 0.51 and 4.99 kept and weighted; r_s = 1, A = 1: loss = -(0.51 + 4.99) / 4
    inputs = decoupled([0.49, 0.51, 4.99, 5.01], [1.0] * 4, [1.0] * 4)
    out, grad = run("icepop", inputs)
    assert_mask(out.discrepancy_mask, [False, True, True, False])
    assert_close(out.loss, -(0.51 + 4.99) / 4)
    assert_close(grad, [0.0, -0.51 / 4, -4.99 / 4, 0.0])


# Sequence MIS. Rows: rho = prod r_d = 1.2 * 1.5 = 1.8; 2 * 1.5 = 3; 0.5 * 0.6 = 0.3. Geometric MIS:
# sqrt(4 * 0.81) = 1.8; sqrt(3 * 3) = 3; sqrt(0.2 * 0.45) = 0.3. r_s (1.1, 1.0), (1, 1), (1.0, 1.1);
# A (1, -1), (1, 1), (1, 1); all inside the clip (0.8, 1.2).
MIS_STALENESS = [[1.1, 1.0], [1.0, 1.0], [1.0, 1.1]]
MIS_ADVANTAGES = [[1.0, -1.0], [1.0, 1.0], [1.0, 1.0]]
MIS_DISCREPANCY = {
    "mis_sequence": [[1.2, 1.5], [2.0, 1.5], [0.5, 0.6]],
    "mis_geometric": [[4.0, 0.81], [3.0, 3.0], [0.2, 0.45]],
}
# Per-token objective when the row is kept: mis_sequence weights it by sg(rho), mis_geometric does not.
MIS_KEPT_OBJECTIVE = {
    "mis_sequence": [[1.8 * 1.1, 1.8 * -1.0], [3.0, 3.0], [0.3 * 1.0, 0.3 * 1.1]],
    "mis_geometric": [[1.1, -1.0], [1.0, 1.0], [1.0, 1.1]],
}


@pytest.mark.parametrize("name", ["mis_sequence", "mis_geometric"])
@pytest.mark.parametrize(
    ("kwargs", "kept_rows"),
    [
        ({}, [True, False, True]),  # default: one-sided, only above the cap C = 2 is rejected (0.3 stays)
        ({"discrepancy_cap": 2.0}, [True, False, True]),
        ({"discrepancy_cap": 2.0, "discrepancy_floor": 0.5}, [True, False, False]),  # two-sided: 0.3 < 0.5 too
        ({"discrepancy_cap": 3.5}, [True, True, True]),
        ({"discrepancy_cap": 1.5, "discrepancy_floor": 0.25}, [False, False, True]),
    ],
)
def test_mis_rejects_sequences_by_their_statistic(name, kwargs, kept_rows):
    inputs = decoupled(MIS_DISCREPANCY[name], MIS_STALENESS, MIS_ADVANTAGES)
    out, grad = run(name, inputs, clip_bounds=(0.8, 1.2), **kwargs)
    objective = [row if kept else [0.0, 0.0] for row, kept in zip(MIS_KEPT_OBJECTIVE[name], kept_rows)]
    assert_close(out.loss, -sum(map(sum, objective)) / 6)
    assert_close(grad, [[-value / 6 for value in row] for row in objective])  # r_s inside: grad = objective
    assert_mask(out.discrepancy_mask, [[kept, kept] for kept in kept_rows])


def test_mis_sequence_one_sided_default_keeps_and_reweights_a_low_product():
    # the hand-computed rows of the default: rho 1.8 kept (1.98, -1.8), rho 3 rejected, rho 0.3 kept (0.3, 0.33)
    inputs = decoupled(MIS_DISCREPANCY["mis_sequence"], MIS_STALENESS, MIS_ADVANTAGES)
    out, grad = run("mis_sequence", inputs, clip_bounds=(0.8, 1.2))
    assert_close(out.loss, -(1.98 - 1.8 + 0.3 + 0.33) / 6)
    assert_close(grad, [[-1.98 / 6, 1.8 / 6], [0.0, 0.0], [-0.3 / 6, -0.33 / 6]])


@pytest.mark.parametrize("name", ["mis_sequence", "mis_geometric"])
@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"discrepancy_cap": 0.9}, "discrepancy_cap"),
        ({"discrepancy_cap": math.inf}, "discrepancy_cap"),
        ({"discrepancy_floor": 0.0}, "discrepancy_floor"),
        ({"discrepancy_floor": 1.1}, "discrepancy_floor"),
    ],
)
def test_mis_bound_errors_name_the_argument(name, kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        get_loss(name, **kwargs)
