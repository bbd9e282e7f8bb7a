"""A group's advantages by each estimator (`rollout.advantage`), worked out by hand."""

import pytest

from lit_asyncrl.rollout.queue.advantages import ESTIMATORS, GroupCentered, GroupNormalized, LeaveOneOut
from lit_asyncrl.rollout.settings import RolloutConfig


def test_grpo_divides_the_centred_rewards_by_the_groups_deviation():
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5 -> +1, -1, -1, +1
    assert GroupNormalized()([1.0, 0.0, 0.0, 1.0]) == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    # 0.9 and 1.0: mean 0.95, std 0.05: a small spread becomes +-1 all the same
    assert GroupNormalized()([0.9, 1.0]) == pytest.approx([-1.0, 1.0], abs=1e-4)
    assert GroupNormalized()([0.3, 0.3]) == [0.0, 0.0]


def test_dr_grpo_centres_without_scaling():
    assert GroupCentered()([1.0, 0.0, 0.0, 1.0]) == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert GroupCentered()([0.9, 1.0]) == pytest.approx([-0.05, 0.05])


def test_rloo_compares_each_reward_with_the_mean_of_the_others():
    # 3, 0, 0: the others' means are 0, 1.5, 1.5 -> 3, -1.5, -1.5 (= 3/2 of Dr. GRPO's 2, -1, -1)
    assert LeaveOneOut()([3.0, 0.0, 0.0]) == pytest.approx([3.0, -1.5, -1.5])
    assert LeaveOneOut()([1.0, 0.0, 0.0, 1.0]) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert LeaveOneOut()([5.0]) == [0.0]


def test_the_setting_names_each_estimator_and_refuses_others():
    assert sorted(ESTIMATORS) == ["dr_grpo", "grpo", "rloo"]
    assert RolloutConfig.from_keys(advantage="rloo").batch.advantage == "rloo"
    with pytest.raises(ValueError, match="rollout.advantage must be one of grpo, dr_grpo, rloo, got 'ppo'"):
        RolloutConfig.from_keys(advantage="ppo")
