"""Aggregation modes on ppo_clip with r = 1, so each valid token's objective is its advantage."""

import pytest

from tests.support.losses import assert_close, inputs_from_ratios, run

# row 0: three valid tokens A = (1, 2, 3); row 1: one valid token A = 4; row 2: no valid token.
ADVANTAGES = [[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0]]
MASK = [[True, True, True], [True, False, False], [False, False, False]]


def aggregated(aggregation, **kwargs):
    inputs = inputs_from_ratios([[1.0] * 3] * 3, ADVANTAGES, loss_mask=MASK)
    return run("ppo_clip", inputs, aggregation=aggregation, **kwargs)


@pytest.mark.parametrize(
    ("aggregation", "kwargs", "expected_loss", "expected_grad"),
    [
        # sum / #valid tokens
        ("token_mean", {}, -(1 + 2 + 3 + 4) / 4, [[-1 / 4, -2 / 4, -3 / 4], [-4 / 4, 0, 0]]),
        # mean over non-empty rows of the row's token mean: (6/3 + 4/1) / 2
        ("seq_mean_token_mean", {}, -(6 / 3 + 4) / 2, [[-1 / 6, -2 / 6, -3 / 6], [-4 / 2, 0, 0]]),
        # mean over non-empty rows of the row's token sum: (6 + 4) / 2
        ("seq_mean_token_sum", {}, -(6 + 4) / 2, [[-1 / 2, -2 / 2, -3 / 2], [-4 / 2, 0, 0]]),
        # sum / constant
        ("fixed", {"normalizer": 8.0}, -10 / 8, [[-1 / 8, -2 / 8, -3 / 8], [-4 / 8, 0, 0]]),
    ],
)
def test_aggregation(aggregation, kwargs, expected_loss, expected_grad):
    out, grad = aggregated(aggregation, **kwargs)
    assert_close(out.loss, expected_loss)
    assert_close(grad, [*expected_grad, [0.0, 0.0, 0.0]])


def test_masked_tokens_stay_in_the_denominator():
    # The r_d mask drops t1 but it still counts: loss = -(1 + 3) / 3, not / 2.
    # pi/ref = 1 everywhere; r_d = ref/mu = 5 for t1, outside (0.5, 2)
    inputs = inputs_from_ratios([1.0, 5.0, 1.0], [1.0, 2.0, 3.0], reference_ratio=[1.0, 5.0, 1.0])
    out, _ = run("decoupled_ppo", inputs, discrepancy_bounds=(0.5, 2.0))
    assert_close(out.loss, -(1 + 3) / 3)
