"""The built-in guess-the-number task."""

import random

import pytest

from lit_asyncrl.envs import GuessNumberEnv
from lit_asyncrl.rollout.serving.instances import training_instance


def test_feedback_win_and_turn_limit():
    env = GuessNumberEnv(max_value=10, max_turns=2)
    episode = env.new_episode(7)
    assert episode.reset() == "?"
    first = episode.step("5;")
    assert (first.observation, first.reward, first.done) == ("H", 0.0, False)
    second = episode.step("9;")
    assert (second.observation, second.reward, second.done, second.success) == ("L", 0.0, True, False)
    win = env.new_episode(7).step("7;")
    assert (win.observation, win.reward, win.done, win.success) == ("W", 1.0, True, True)


@pytest.mark.parametrize("action", ["", "5", "x;", "05;", "5;;"])
def test_malformed_guess_ends_the_episode_with_the_penalty(action):
    result = GuessNumberEnv(malformed_reward=-0.2).new_episode(3).step(action)
    assert (result.reward, result.done, result.success) == (-0.2, True, False)


def test_bisection_demonstration_always_wins_within_the_turns():
    env = GuessNumberEnv(max_value=10, max_turns=4)
    for secret in range(1, 11):
        episode = env.new_episode(secret)
        results = [episode.step(action) for action, _ in env.demonstration(secret)]
        assert results[-1].success
        assert [r.observation for r in results] == [obs for _, obs in env.demonstration(secret)]


def test_random_guessing_wins_about_a_third():
    env, rng, wins = GuessNumberEnv(), random.Random(0), 0
    for _ in range(4000):
        episode = env.new_episode(training_instance(env, rng))
        for _ in range(env.max_turns):
            result = episode.step(f"{rng.randint(1, 10)};")
            if result.done:
                wins += result.success
                break
    assert 0.30 < wins / 4000 < 0.37  # 1 - 0.9**4 = 0.344


@pytest.mark.parametrize(("kwargs", "key"), [({"max_value": 1}, "env.max_value"), ({"max_turns": 0}, "env.max_turns")])
def test_bad_arguments_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        GuessNumberEnv(**kwargs)
