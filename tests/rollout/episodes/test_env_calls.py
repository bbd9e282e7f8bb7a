"""Environment calls from the engine loop: async steps awaited, sync steps pooled, latency, timeout.

The engine is the fake of test_producer (an event loop on a thread, a scripted `generate`); the
tokenizer is the tiny policy's (character c has id ord(c) - 27).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from lit_asyncrl.envs import Environment, GuessNumberEnv, Transition
from lit_asyncrl.envs.base import call_blocking
from lit_asyncrl.rollout.engine.protocol import TurnOutput
from lit_asyncrl.rollout.episodes.env_calls import EnvCaller
from lit_asyncrl.rollout.episodes.formats import PlainFormat
from lit_asyncrl.rollout.episodes.runner import EpisodeSettings, play_episode
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.records import Trajectory
from lit_asyncrl.text import UnencodableTextError, encode_text
from tests.support.fakes import FakeEngine


def guess(text: str):
    """A turn that writes `text` (e.g. "5;") at once."""

    async def turn(engine, prompt_ids, on_tokens):
        ids = [ord(char) - 27 for char in text]
        on_tokens(ids, [-0.1] * len(ids))
        return TurnOutput(ids, [-0.1] * len(ids), [engine.version] * len(ids), "stop")

    return turn


class ThreadRecordingEnv(GuessNumberEnv):
    """Guess-the-number whose episodes record the thread of each call and sleep in `step`."""

    def __init__(self, step_sleep_s: float = 0.0, asynchronous: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.step_sleep_s, self.asynchronous, self.threads = step_sleep_s, asynchronous, []

    def new_episode(self, instance):
        inner, env = super().new_episode(instance), self

        class Sync:
            def reset(self, seed=None):
                env.threads.append(threading.current_thread().name)
                return inner.reset(seed)

            def step(self, action):
                env.threads.append(threading.current_thread().name)
                time.sleep(env.step_sleep_s)
                return inner.step(action)

        class Async:
            async def reset(self, seed=None):
                env.threads.append(threading.current_thread().name)
                return inner.reset(seed)

            async def step(self, action):
                env.threads.append(threading.current_thread().name)
                await asyncio.sleep(env.step_sleep_s)
                return inner.step(action)

        return Async() if self.asynchronous else Sync()


def play_many(engine, env, tokenizer, count: int, workers: int) -> tuple[list[Trajectory], float]:
    caller = EnvCaller(max_workers=workers)

    async def run_all():
        plays = [
            play_episode(
                engine,
                env,
                PlainFormat(tokenizer, env),
                5,
                Trajectory(group_id=0),
                EpisodeSettings(call_env=caller, sampling=SamplingSettings(temperature=1.0, top_k=-1), max_context=256),
            )
            for _ in range(count)
        ]
        return await asyncio.gather(*plays)

    start = time.monotonic()
    try:
        return engine.run(run_all(), timeout_s=60), time.monotonic() - start
    finally:
        caller.close()
        engine.shutdown()


def test_async_steps_run_on_the_engine_loop_and_sync_steps_in_the_pool(tokenizer):
    for asynchronous, expected_prefix in ((True, "fake-engine"), (False, "lit-asyncrl-env")):
        env = ThreadRecordingEnv(asynchronous=asynchronous)
        trajectories, _ = play_many(FakeEngine(guess("5;")), env, tokenizer, count=2, workers=2)
        assert [t.success for t in trajectories] == [True, True]
        assert len(env.threads) == 4  # reset + one winning step, twice
        assert all(name.startswith(expected_prefix) for name in env.threads), env.threads


@pytest.mark.parametrize("asynchronous", [False, True])
def test_sixteen_slow_steps_overlap_instead_of_adding_up(tokenizer, asynchronous):
    # 16 episodes, each one step of 0.5 s: in sequence 8 s, overlapped about 0.5 s.
    env = ThreadRecordingEnv(step_sleep_s=0.5, asynchronous=asynchronous)
    trajectories, seconds = play_many(FakeEngine(guess("5;")), env, tokenizer, count=16, workers=16)
    assert all(t.success for t in trajectories)
    assert seconds < 1.5, seconds
    assert min(t.duration_s for t in trajectories) >= 0.5


def test_latency_is_added_to_every_answer(tokenizer):
    # Secret 5, guesses 3 (H), then 5 (W): reset + 2 answers = 3 x 0.2 s of latency.
    turns = iter(["3;", "5;"])

    async def scripted(engine, prompt_ids, on_tokens):
        return await guess(next(turns))(engine, prompt_ids, on_tokens)

    (trajectory,), seconds = play_many(
        FakeEngine(scripted), GuessNumberEnv(latency_s=0.2), tokenizer, count=1, workers=1
    )
    assert trajectory.success and trajectory.num_turns == 2
    assert 0.6 <= trajectory.duration_s < 0.9, trajectory.duration_s
    # the observations are in the context: <bos> ? 3 ; H 5 ;
    assert tokenizer.decode(trajectory.token_ids, skip_special_tokens=True) == "?3;H5;"


def test_an_episode_past_its_timeout_ends_truncated_with_its_tokens(tokenizer):
    env = ThreadRecordingEnv(step_sleep_s=5.0, asynchronous=True, episode_timeout_s=0.3)
    (trajectory,), seconds = play_many(FakeEngine(guess("4;")), env, tokenizer, count=1, workers=1)
    assert trajectory.timed_out and not trajectory.success
    assert seconds < 2.0
    assert trajectory.num_policy_tokens == 2  # the turn it wrote is kept for training


class ToolCrash(RuntimeError):
    pass


def faulty_env(reset=lambda: "?", step=lambda action: Transition("H", 0.0, False, False, {})):
    """Guess-the-number whose episodes answer with `reset()` and `step(action)` as given."""

    class Faulty(GuessNumberEnv):
        def new_episode(self, instance):
            class Episode:
                def reset(self, seed=None):
                    return reset()

                def step(self, action):
                    return step(action)

            return Episode()

    return Faulty(max_turns=2)


def crash(*args):
    raise ToolCrash("tool crashed")


@pytest.mark.parametrize(
    ("env", "reason", "fragment"),
    [
        (faulty_env(reset=crash), "env_error", "Faulty.reset raised ToolCrash('tool crashed')"),
        (faulty_env(step=crash), "env_error", "Faulty.step raised ToolCrash('tool crashed')"),
        (faulty_env(step=lambda action: "W"), "env_malformed", "Faulty: step() must return a Transition"),
        (
            faulty_env(step=lambda action: ("H", float("nan"), False, False, {})),
            "env_malformed",
            "reward: a finite number",
        ),
        (faulty_env(step=lambda action: ("H", "lots", False, False, {})), "env_malformed", "reward: a finite number"),
        (faulty_env(step=lambda action: ("H", 0.0, False, False, None)), "env_malformed", "info: a dict"),
        (
            faulty_env(step=lambda action: (None, 0.0, False, False, {})),
            "env_malformed",
            "observations must be str, got None",
        ),
        (faulty_env(reset=lambda: "caf\u00e9"), "env_malformed", "cannot encode: ['\u00e9']"),
    ],
    ids=[
        "reset raises",
        "step raises",
        "not a transition",
        "nan reward",
        "text reward",
        "info not a dict",
        "no text",
        "unencodable",
    ],
)
def test_an_environment_fault_ends_the_episode_as_failed_with_its_reason(tokenizer, env, reason, fragment):
    (trajectory,), _ = play_many(FakeEngine(guess("5;")), env, tokenizer, count=1, workers=1)
    assert trajectory.env_failure == reason
    assert fragment in trajectory.env_failure_message
    assert not trajectory.success and trajectory.reward == 0.0


def test_plain_five_tuples_are_accepted_like_gymnasium(tokenizer):
    class Tuples(GuessNumberEnv):
        def new_episode(self, instance):
            class Episode:
                def reset(self, seed=None):
                    return "?"

                def step(self, action):
                    return ("W", 1.0, True, False, {"success": True})

            return Episode()

    (trajectory,), _ = play_many(FakeEngine(guess("5;")), Tuples(), tokenizer, count=1, workers=1)
    assert (trajectory.reward, trajectory.success) == (1.0, True)


def test_text_outside_the_vocabulary_is_an_error_naming_the_characters(tokenizer):
    assert encode_text(tokenizer, "look 42\n{x}_\\") == [ord(c) - 27 if c != "\n" else 4 for c in "look 42\n{x}_\\"]
    with pytest.raises(UnencodableTextError, match=r"GuessNumberEnv.reset has characters .*\['é', '€'\]"):
        encode_text(tokenizer, "café 5€", source="GuessNumberEnv.reset")


def test_transition_unpacks_like_gymnasium_and_reports_success():
    observation, reward, terminated, truncated, info = Transition("W", 1.0, True, False, {"success": True})
    assert (observation, reward, terminated, truncated, info) == ("W", 1.0, True, False, {"success": True})
    assert Transition("H", 0.0, False, True).done and not Transition("H", 0.0, False, True).success


def test_call_blocking_runs_sync_and_async_methods():
    async def answer(x):
        return x + 1

    assert call_blocking(answer, 1) == 2
    assert call_blocking(lambda x: x * 2, 4) == 8


def test_latency_and_timeout_are_checked_on_every_environment():
    with pytest.raises(ValueError, match="env.latency_s"):
        GuessNumberEnv(latency_s=-1)
    with pytest.raises(ValueError, match="env.episode_timeout_s"):
        GuessNumberEnv(episode_timeout_s=0)
    assert issubclass(GuessNumberEnv, Environment)
