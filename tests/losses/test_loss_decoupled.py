"""Decoupled PPO with the train-infer mask, hand-computed (discrepancy 0.9/1.1, clip 0.8/1.2)."""

import pytest

from tests.support.losses import assert_close, assert_mask, inputs_from_ratios, run

# token  r_d=ref/mu  r_s=pi/ref  A    kept  inside  objective = r_d * surrogate     d/dlogp
# t0     1.05        1.1         2    yes   yes     1.05 * 2.2   = 2.31             2.31
# t1     1.2         1.0         1    no    yes     0                               0
# t2     0.95        1.5         1    yes   no      0.95 * 1.2   = 1.14             0
# t3     0.8         0.5         -1   no    no      0                               0
# t4     0.92        0.9         -1   yes   yes     0.92 * -0.9  = -0.828           -0.828
DISCREPANCY = [1.05, 1.2, 0.95, 0.8, 0.92]
STALENESS = [1.1, 1.0, 1.5, 0.5, 0.9]
ADVANTAGES = [2.0, 1.0, 1.0, -1.0, -1.0]


def decoupled_inputs(version_gap=None):
    total = [d * s for d, s in zip(DISCREPANCY, STALENESS)]  # pi/mu = r_d * r_s
    return inputs_from_ratios(total, ADVANTAGES, reference_ratio=DISCREPANCY, version_gap=version_gap)


def test_decoupled_values_gradients_and_masks():
    out, grad = run("decoupled_ppo", decoupled_inputs(), discrepancy_bounds=(0.9, 1.1), clip_bounds=(0.8, 1.2))
    assert_close(out.loss, -(2.31 + 1.14 - 0.828) / 5)
    assert_close(grad, [-2.31 / 5, 0.0, 0.0, 0.0, 0.828 / 5])
    assert_mask(out.discrepancy_mask, [True, False, True, False, True])
    assert_mask(out.clip_mask, [True, True, False, False, True])
    assert out.metrics["train_infer_mask"] == pytest.approx(0.6, abs=1e-12)
    assert out.metrics["ppo_clip_ratio"] == pytest.approx(0.4, abs=1e-12)


def test_decoupled_metrics_by_version_gap_bucket():
    out, _ = run("decoupled_ppo", decoupled_inputs(version_gap=[0, 0, 1, 1, 7]),
                 discrepancy_bounds=(0.9, 1.1), clip_bounds=(0.8, 1.2))  # fmt: skip
    metrics = out.metrics
    assert metrics["train_infer_mask/gap_0"] == pytest.approx(0.5)  # t0 kept, t1 dropped
    assert metrics["ppo_clip_ratio/gap_0"] == pytest.approx(0.0)
    assert metrics["train_infer_mask/gap_1"] == pytest.approx(0.5)  # t2 kept, t3 dropped
    assert metrics["ppo_clip_ratio/gap_1"] == pytest.approx(1.0)  # both clipped
    assert metrics["train_infer_mask/gap_4plus"] == pytest.approx(1.0)
    assert metrics["policy_tokens/gap_4plus"] == 1.0
    assert "train_infer_mask/gap_2" not in metrics  # empty bucket
    assert metrics["version_gap_mean"] == pytest.approx(9 / 5)
    assert metrics["version_gap_max"] == 7.0


def test_decoupled_requires_reference():
    inputs = inputs_from_ratios([1.0], [1.0])
    with pytest.raises(ValueError, match="ref_logprobs"):
        run("decoupled_ppo", inputs)
