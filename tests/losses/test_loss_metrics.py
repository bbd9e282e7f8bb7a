"""Metrics against hand-computed values."""

import math

import pytest

from tests.support.losses import inputs_from_ratios, run

# r = pi/mu = (2, 0.5, 1) on policy tokens with gaps (0, 1, 5); a padding token with gap 2.
RATIOS = [2.0, 0.5, 1.0, 3.0]
MASK = [True, True, True, False]
GAPS = [0, 1, 5, 2]


def metrics(version_gap=GAPS):
    out, _ = run("ppo_clip", inputs_from_ratios(RATIOS, [0.0] * 4, loss_mask=MASK, version_gap=version_gap),
                 clip_bounds=(0.4, 2.5))  # fmt: skip
    return out.metrics


def test_global_metrics():
    m = metrics()
    assert m["kl_k1"] == pytest.approx(0.0, abs=1e-12)  # -(log 2 + log 0.5 + 0) / 3
    assert m["kl_k3"] == pytest.approx(((1 - math.log(2)) + (-0.5 + math.log(2)) + 0) / 3, abs=1e-12)
    assert m["ess"] == pytest.approx(3.5**2 / (3 * (4 + 0.25 + 1)), abs=1e-12)  # 0.7778
    assert m["ratio_min"] == pytest.approx(0.5)
    assert m["ratio_mean"] == pytest.approx(3.5 / 3)
    assert m["ratio_max"] == pytest.approx(2.0)
    assert m["train_infer_mask"] == 1.0
    assert m["ppo_clip_ratio"] == 0.0
    assert m["policy_tokens"] == 3.0
    assert m["nonfinite_tokens"] == 0.0
    assert m["version_gap_mean"] == pytest.approx(2.0)  # (0 + 1 + 5) / 3, padding excluded
    assert m["version_gap_max"] == 5.0
    assert all(isinstance(value, float) for value in m.values())


def test_bucket_metrics():
    m = metrics()
    assert m["ratio_mean/gap_0"] == pytest.approx(2.0)
    assert m["kl_k1/gap_0"] == pytest.approx(-math.log(2))
    assert m["kl_k3/gap_1"] == pytest.approx(-0.5 + math.log(2))
    assert m["ratio_max/gap_4plus"] == pytest.approx(1.0)
    assert m["ess/gap_1"] == pytest.approx(1.0)
    assert "ratio_mean/gap_2" not in m  # only the padding token had gap 2
    assert "policy_tokens/gap_3" not in m


def test_no_bucket_keys_without_version_gap():
    m = metrics(version_gap=None)
    assert not any("/" in key for key in m)
    assert "version_gap_mean" not in m


def test_ppo_clip_ratio_counts_clipped_tokens():
    out, _ = run("ppo_clip", inputs_from_ratios([2.0, 0.5, 1.0], [1.0, -1.0, 1.0]), clip_bounds=(0.8, 1.2))
    assert out.metrics["ppo_clip_ratio"] == pytest.approx(2 / 3)


def test_ratios_far_below_one_leave_the_ess_unknown_not_a_division_by_zero():
    # r = e^-30 on every token, cut to e^-20 (the log-ratio limit): the sums of e = r - 1 then give
    # n + 2 sum e + sum e^2 = 3 - 6 + 3 = 0 for sum r^2 (to within rounding), so the ESS is unknown.
    out, _ = run("ppo_clip", inputs_from_ratios([math.exp(-30)] * 3, [0.0] * 3), clip_bounds=(0.8, 1.2))
    assert math.isnan(out.metrics["ess"])
    assert out.metrics["ratio_max"] == pytest.approx(math.exp(-20), rel=1e-6)
    assert out.metrics["kl_k1"] == pytest.approx(20.0, rel=1e-6)
