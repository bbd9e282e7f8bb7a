"""How a group's rewards become its episodes' advantages (`rollout.advantage`).

A group is the `rollout.group_size` episodes of one task instance; each estimator compares an
episode's reward with the others of its group, so a group whose rewards are all equal gets
advantages that are all zero (and `rollout.filter_zero_advantage` can drop it).

- `grpo` (GRPO; TRL's default `scale_rewards="group"`): the reward minus the group's mean, over the
  group's standard deviation.
- `dr_grpo` (Dr. GRPO; TRL's `scale_rewards="none"`): the reward minus the group's mean, unscaled:
  dividing by the standard deviation weighs groups whose rewards barely differ as much as groups
  with a real spread.
- `rloo` (RLOO, REINFORCE leave-one-out; TRL's `RLOOTrainer`): the reward minus the mean of the
  *other* rewards of its group, an estimate of the baseline that does not contain the episode itself.
"""

from __future__ import annotations

import abc

import torch

#: Added to the standard deviation, so that a group of equal rewards divides 0 by a positive number.
STD_EPS = 1e-6


class AdvantageEstimator(abc.ABC):
    """Advantages of one group's episodes from their rewards (in the same order)."""

    @abc.abstractmethod
    def __call__(self, rewards: list[float]) -> list[float]: ...


class GroupNormalized(AdvantageEstimator):
    """GRPO: (reward - group mean) / (group standard deviation + eps), the population deviation."""

    def __call__(self, rewards: list[float]) -> list[float]:
        values = torch.tensor(rewards, dtype=torch.float64)
        return ((values - values.mean()) / (values.std(unbiased=False) + STD_EPS)).tolist()


class GroupCentered(AdvantageEstimator):
    """Dr. GRPO: reward - group mean."""

    def __call__(self, rewards: list[float]) -> list[float]:
        values = torch.tensor(rewards, dtype=torch.float64)
        return (values - values.mean()).tolist()


class LeaveOneOut(AdvantageEstimator):
    """RLOO: reward - mean of the group's other rewards (n / (n - 1) times Dr. GRPO's); a group of one
    episode has no other to compare with: advantage 0."""

    def __call__(self, rewards: list[float]) -> list[float]:
        values = torch.tensor(rewards, dtype=torch.float64)
        count = len(rewards)
        if count < 2:
            return [0.0] * count
        others_mean = (values.sum() - values) / (count - 1)
        return (values - others_mean).tolist()


#: `rollout.advantage` names.
ESTIMATORS: dict[str, type[AdvantageEstimator]] = {
    "grpo": GroupNormalized,
    "dr_grpo": GroupCentered,
    "rloo": LeaveOneOut,
}
