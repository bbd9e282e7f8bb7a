"""The held-out search stops once a small task's instances were all drawn, and finds the same set."""

from __future__ import annotations

import random

from lit_asyncrl.envs.base import Environment
from lit_asyncrl.rollout.serving.instances import EXHAUSTED_AFTER, MAX_DRAWS, held_out_instances


class CountedDraws(Environment):
    """Instances 0..size-1; instance i is held out when i % 3 == 0; counts its draws."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size, self.draws = size, 0

    def generate_instance(self, rng: random.Random) -> int:
        self.draws += 1
        return rng.randrange(self.size)

    def is_held_out(self, instance: int) -> bool:
        return instance % 3 == 0

    def new_episode(self, instance):  # pragma: no cover - never played here
        raise NotImplementedError


def test_a_small_tasks_whole_held_out_split_is_found_without_drawing_ten_thousand_times():
    env = CountedDraws(size=12)
    found = held_out_instances(env, count=100)  # more than the split has: 0, 3, 6, 9
    assert sorted(found) == [0, 3, 6, 9]
    # 12 instances are all drawn within about a hundred draws; then 1,000 draws in a row bring nothing new.
    assert EXHAUSTED_AFTER < env.draws < 200 + EXHAUSTED_AFTER < MAX_DRAWS


def test_a_large_task_is_searched_until_the_count_is_met():
    env = CountedDraws(size=2**31)
    found = held_out_instances(env, count=50, seed=3)
    assert len(set(found)) == 50 and all(instance % 3 == 0 for instance in found)
    # the same draws as a plain search that stops at the 50th held-out instance
    rng, expected = random.Random(3), []
    while len(expected) < 50:
        instance = rng.randrange(2**31)
        if instance % 3 == 0 and instance not in expected:
            expected.append(instance)
    assert found == expected
