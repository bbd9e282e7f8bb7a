"""RolloutProducer and VLLMRolloutService's liveness and live-version logic, on a fake engine.

The fake engine is what the producer uses of `VLLMEngine`: an asyncio `loop` on a daemon thread,
a `version`, `run(coro, timeout_s)` and `async generate(...)` returning a `TurnOutput`. The task is
the real GuessNumberEnv, the tokenizer the tiny policy's: one token per character, ids are positions
in VOCAB = <pad> <bos> <eos> <unk> newline and printable ASCII from the space (id 5) up, so character
c has id ord(c) - 27: <bos>=1, <eos>=2, '5'=26, ';'=32, '?'=36, 'a'=70. No vLLM engine is started.
"""

from __future__ import annotations

import asyncio
import pickle
import threading
import time
import types

import pytest

from lit_asyncrl.envs import GuessNumberEnv, TaskMix
from lit_asyncrl.rollout.engine.protocol import TurnOutput
from lit_asyncrl.rollout.queue.buffer import RolloutBuffer
from lit_asyncrl.rollout.queue.checkpointed_groups import groups_to_state
from lit_asyncrl.rollout.records import Trajectory
from lit_asyncrl.rollout.service import RolloutServiceError
from lit_asyncrl.rollout.serving.vllm_service import VLLMRolloutService
from lit_asyncrl.rollout.settings import RolloutConfig
from tests.support.fakes import malformed_guess
from tests.support.polling import holds_for, wait_for
from tests.support.tiny_policy import BOS, EOS, LETTER_A, QUESTION, SEMI  # noqa: E402 (ids the hand values use)


def blocking_turn(release: list):
    async def turn(engine, prompt_ids, on_tokens):
        on_tokens([LETTER_A], [-0.5])  # a partial turn, then generation hangs until cancelled
        event = asyncio.Event()
        release.append(event)
        await event.wait()
        raise AssertionError("never released")

    return turn


async def boom(engine, prompt_ids, on_tokens):
    raise RuntimeError("boom")


def delayed_boom(delay_s: float):
    async def turn(engine, prompt_ids, on_tokens):
        await asyncio.sleep(delay_s)
        raise RuntimeError("boom")

    return turn


def make_service(
    model_path,
    *,
    max_version_gap: int = 3,
    buffer_capacity: int = 8,
    liveness_poll_s: float = 0.5,
    checkpoint_pending: bool = True,
) -> VLLMRolloutService:
    settings = RolloutConfig.from_keys(
        checkpoint_pending=checkpoint_pending,
        group_size=2,
        groups_per_batch=1,
        max_version_gap=max_version_gap,
        buffer_capacity=buffer_capacity,
        max_concurrent_groups=2,
        max_model_len=256,
    )
    return VLLMRolloutService(model_path, GuessNumberEnv(), settings, seed=0, liveness_poll_s=liveness_poll_s)


# -- (a) the sync quota ------------------------------------------------------------------------


def test_sync_mode_starts_groups_per_version_then_waits_for_the_next_version(engines, tokenizer):
    engine = engines.engine(malformed_guess)
    buffer = RolloutBuffer(capacity=1000, max_version_gap=10)
    producer = engines.producer(engine, buffer, tokenizer, groups_per_version=2)
    producer.start()

    wait_for(lambda: buffer.produced == 4, "2 groups of 2 episodes at version 0")
    assert holds_for(lambda: producer.groups_started == 2 and buffer.produced == 4), (
        "a third group started at version 0"
    )

    engine.version = 1
    wait_for(lambda: buffer.produced == 8, "2 more groups at version 1")
    assert holds_for(lambda: producer.groups_started == 4 and buffer.produced == 8), (
        "a fifth group started at version 1"
    )

    groups = buffer.take(4, timeout_s=1)
    assert [group[0].group_id for group in groups] == [0, 1, 2, 3]
    for group, version in zip(groups, [0, 0, 1, 1]):
        assert len(group) == 2
        for trajectory in group:
            # <bos> ? | a ; : the prompt, then one malformed turn (reward -0.2, the episode ends)
            assert trajectory.token_ids == [BOS, QUESTION, LETTER_A, SEMI]
            assert trajectory.loss_mask == [False, False, True, True]
            assert trajectory.behavior_logprobs == [0.0, 0.0, -0.5, -0.25]
            assert trajectory.versions == [-1, -1, version, version]
            assert trajectory.reward == pytest.approx(-0.2)
            assert trajectory.success is False and trajectory.num_turns == 1
            assert trajectory.advantage == 0.0  # equal rewards in the group: (r - mean) / (std + eps) = 0
    # what the producer asked the engine: the whole context, max_turn_tokens = len("10") + 1,
    # stop at ';' or <eos>
    assert engine.requests[0] == {
        "prompt": [BOS, QUESTION],
        "max_tokens": 3,
        "temperature": 1.0,
        "top_k": -1,
        "stop": [SEMI, EOS],
    }
    assert len(engine.requests) == 8
    assert producer.error is None
    assert buffer.accounting_holds()


# -- (b) cancellation --------------------------------------------------------------------------


def test_stop_cancels_blocked_groups_and_releases_their_room(engines, tokenizer):
    events: list[asyncio.Event] = []
    engine = engines.engine(blocking_turn(events))
    buffer = RolloutBuffer(capacity=8, max_version_gap=3)
    producer = engines.producer(engine, buffer, tokenizer, max_concurrent_groups=3)
    producer.start()

    # 3 groups x 2 episodes, each blocked in its first turn after one streamed token
    wait_for(lambda: len(engine.requests) == 6 and producer.in_flight_groups == 3, "3 blocked groups")
    assert holds_for(lambda: producer.in_flight_groups == 3, 0.1)  # max_concurrent_groups caps it
    assert len(producer.active) == 6
    assert all(t.token_ids == [BOS, QUESTION, LETTER_A] and t.versions == [-1, -1, 0] for t in producer.active)
    assert producer.oldest_in_flight_version == 0
    assert not buffer.try_reserve(3)  # 6 of 8 reserved

    start = time.monotonic()
    producer.stop()
    assert time.monotonic() - start < 5.0
    assert producer.in_flight_groups == 0
    assert producer.active == set()
    assert producer.oldest_in_flight_version is None
    assert producer.error is None  # cancellation is not a failure
    assert buffer.try_reserve(8)  # all reserved room came back
    buffer.release(8)
    assert buffer.accounting_holds()
    assert buffer.counts() == {"produced": 0, "trained": 0, "dropped": 0, "dropped_stale": 0, "pending": 0}


# -- (c) errors reach the trainer ----------------------------------------------------------------


def test_generation_error_is_kept_and_room_released(engines, tokenizer):
    engine = engines.engine(boom)
    buffer = RolloutBuffer(capacity=8, max_version_gap=3)
    producer = engines.producer(engine, buffer, tokenizer)
    producer.start()

    wait_for(lambda: producer.error is not None, "the producer's error")
    assert isinstance(producer.error, RuntimeError)
    assert str(producer.error) == "boom"
    producer.stop()
    assert buffer.try_reserve(8)
    buffer.release(8)
    assert buffer.produced == 0 and buffer.accounting_holds()


def test_the_first_failure_is_kept_not_its_echoes(engines, tokenizer):
    raised: list[RuntimeError] = []

    async def numbered_boom(engine, prompt_ids, on_tokens):
        raised.append(RuntimeError(f"boom {len(raised) + 1}"))
        raise raised[-1]

    engine = engines.engine(numbered_boom)
    producer = engines.producer(engine, RolloutBuffer(capacity=8, max_version_gap=3), tokenizer)
    producer.start()
    wait_for(lambda: len(raised) >= 10, "several failed groups")  # later groups fail too
    producer.stop()
    assert producer.error is raised[0]
    assert str(producer.error) == "boom 1"


def test_service_names_the_failed_producer(engines, tokenizer, model_path):
    engine = engines.engine(boom)
    service = make_service(model_path)
    producer = engines.producer(engine, service.buffer, tokenizer)
    service.lanes.engines, service.lanes.producers = [engine], [producer]
    producer.start()
    wait_for(lambda: producer.error is not None, "the producer's error")

    start = time.monotonic()
    with pytest.raises(RolloutServiceError, match="boom") as caught:
        service.next_batch(timeout_s=30)
    assert time.monotonic() - start < 1.0  # checked before waiting for a batch
    assert "rollout generation failed" in str(caught.value)
    assert isinstance(caught.value.__cause__, RuntimeError) and str(caught.value.__cause__) == "boom"

    service.close()  # stops the producer, then the engine
    assert service.lanes.engines == [None] and service.lanes.producers == [None]
    assert not engine.loop.is_running()
    with pytest.raises(RolloutServiceError, match="not started"):
        service.next_batch(timeout_s=1)


def test_waiting_next_batch_sees_a_failure_within_a_liveness_poll(engines, tokenizer, model_path):
    engine = engines.engine(delayed_boom(0.3))
    service = make_service(model_path, liveness_poll_s=0.1)
    producer = engines.producer(engine, service.buffer, tokenizer)
    service.lanes.engines, service.lanes.producers = [engine], [producer]
    producer.start()

    start = time.monotonic()
    with pytest.raises(RolloutServiceError, match="boom"):
        service.next_batch(timeout_s=30)
    assert time.monotonic() - start < 3.0  # 0.3 s to fail + one 0.1 s poll, far below 30 s


def test_service_names_the_dead_engine(model_path):
    service = make_service(model_path)
    service.lanes.engines = [types.SimpleNamespace(dead_reason=lambda: "its engine-core process died", version=0)]
    with pytest.raises(RolloutServiceError, match="vLLM engine") as caught:
        service.next_batch(timeout_s=30)
    assert str(caught.value) == "the vLLM engine died: its engine-core process died"


# -- (d) live versions ---------------------------------------------------------------------------


def group_with_versions(group_id: int, per_episode: list[list[int]]) -> list[Trajectory]:
    group = []
    for versions in per_episode:
        trajectory = Trajectory(group_id=group_id)
        trajectory.extend_context([BOS, QUESTION])
        trajectory.extend_policy([8] * len(versions), [-0.5] * len(versions), versions)
        group.append(trajectory)
    return group


def test_live_versions_span_oldest_pending_or_in_flight_to_newest(model_path):
    service = make_service(model_path, max_version_gap=3)
    service.lanes.engines = [types.SimpleNamespace(version=5, dead_reason=lambda: None)]
    service.lanes.producers = [types.SimpleNamespace(oldest_in_flight_version=4, error=None)]
    assert service.buffer.try_reserve(2)
    service.buffer.put_group(group_with_versions(0, [[3, 4], [5]]), reserved=2)  # oldest token: 3
    service.buffer.set_trainer_version(5)  # gap 5 - 3 = 2 <= 3: kept
    assert service.buffer.pending == 2
    assert service.live_versions() == [3, 4, 5]

    # in flight older than anything pending
    service.lanes.producers[0].oldest_in_flight_version = 2
    assert service.live_versions() == [2, 3, 4, 5]

    # nothing pending, one group in flight since version 4
    service.buffer.take(1, timeout_s=0)
    service.lanes.producers[0].oldest_in_flight_version = 4
    assert service.live_versions() == [4, 5]

    # nothing pending, nothing in flight: only the newest version
    service.lanes.producers[0].oldest_in_flight_version = None
    assert service.live_versions() == [5]


def test_live_versions_newest_is_the_newer_of_trainer_and_engine(model_path):
    service = make_service(model_path, max_version_gap=3)
    service.lanes.engines = [types.SimpleNamespace(version=4, dead_reason=lambda: None)]
    service.lanes.producers = [types.SimpleNamespace(oldest_in_flight_version=None, error=None)]
    service.buffer.set_trainer_version(6)  # trainer ahead of the engine (weight_sync_every > 1)
    assert service.live_versions() == [6]
    service.lanes.producers[0].oldest_in_flight_version = 4
    assert service.live_versions() == [4, 5, 6]


# -- regression: episodes without policy tokens once made their group "stale" -------------------


def test_group_of_episodes_without_policy_tokens_is_not_dropped_as_stale(engines, tokenizer):
    # max_context=2: the prompt <bos> ? fills the context, play_episode stops before the first turn
    # (room < 1), and the producer files a group of 2 episodes with no policy token at all.
    engine = engines.engine(malformed_guess)
    buffer = RolloutBuffer(capacity=2, max_version_gap=3)
    producer = engines.producer(engine, buffer, tokenizer, max_context=2, max_concurrent_groups=1)
    producer.start()
    wait_for(lambda: buffer.produced == 2, "one group of 2 episodes")
    producer.stop()
    assert engine.requests == []  # the engine was never asked for a token
    assert all(t.token_ids == [BOS, QUESTION] and t.num_policy_tokens == 0 for t in buffer.pending_trajectories())

    # No token of the group was sampled by any version, so no version gap can make it stale.
    buffer.set_trainer_version(3)
    assert buffer.dropped["stale"] == 0
    assert buffer.pending == 2


# -- environment faults --------------------------------------------------------------------------


class EveryOtherResetFails(GuessNumberEnv):
    """The 2nd, 4th, ... episode's reset raises: one episode of each group of 2 fails."""

    def __init__(self) -> None:
        super().__init__()
        self.resets = 0
        self.lock = threading.Lock()

    def new_episode(self, instance):
        inner, env = super().new_episode(instance), self

        class Episode:
            def reset(self, seed=None):
                with env.lock:
                    env.resets += 1
                    failing = env.resets % 2 == 0
                if failing:
                    raise ConnectionError("simulated user went away")
                return inner.reset(seed)

            def step(self, action):
                return inner.step(action)

        return Episode()


def test_episodes_the_environment_fails_are_dropped_with_their_reason_and_the_rest_trained(engines, tokenizer):
    engine = engines.engine(malformed_guess)
    buffer = RolloutBuffer(capacity=8, max_version_gap=10)
    producer = engines.producer(
        engine, buffer, tokenizer, env=EveryOtherResetFails(), max_concurrent_groups=1, env_failure_limit=0.6
    )
    producer.start()
    wait_for(lambda: buffer.counts()["produced"] >= 6, "3 groups")
    producer.stop()
    counts = buffer.counts()
    assert buffer.accounting_holds()
    # Every group of 2 lost one episode: half of what was produced is dropped as env_error.
    assert counts["dropped_env_error"] == counts["produced"] // 2 == counts["pending"]
    assert all(len(group) == 1 for group in buffer.take(counts["pending"], timeout_s=1))
    assert producer.stats.env_failures == {"env_error": counts["dropped_env_error"]}
    assert "EveryOtherResetFails.reset raised ConnectionError('simulated user went away')" in producer.last_env_failure
    assert producer.error is None  # 50 % stays under the 60 % limit: training goes on


def test_a_failure_rate_above_the_limit_stops_the_run_naming_counts_and_the_last_error(engines, tokenizer):
    engine = engines.engine(malformed_guess)
    buffer = RolloutBuffer(capacity=64, max_version_gap=10)
    producer = engines.producer(
        engine, buffer, tokenizer, env=EveryOtherResetFails(), env_failure_limit=0.4, env_failure_window=4
    )
    producer.start()
    wait_for(lambda: producer.error is not None, "the failure-rate stop")
    producer.stop()
    message = str(producer.error)
    assert "of the last 4 episodes failed in the environment, above rollout.env_failure_limit=0.4" in message
    assert "env_error:" in message and "simulated user went away" in message
    assert buffer.accounting_holds()


def test_episodes_that_never_give_the_agent_a_turn_stop_the_run_within_seconds(engines, tokenizer):
    engine = engines.engine(malformed_guess)
    buffer = RolloutBuffer(capacity=256, max_version_gap=10)
    env = GuessNumberEnv()
    env.max_turns = 0  # every episode ends at its reset: the agent never gets a turn
    producer = engines.producer(engine, buffer, tokenizer, env=env)
    producer.start()
    started = time.monotonic()
    wait_for(lambda: producer.error is not None, "the no-progress stop")
    producer.stop()
    assert time.monotonic() - started < 5
    assert "episodes ended without a single agent token: nothing can be trained" in str(producer.error)
    assert engine.requests == []  # not one turn was ever generated


class RecordsAccounting(TaskMix):
    """A one-task mixture that keeps the counts each training draw passes to its draw weights."""

    def __init__(self) -> None:
        super().__init__({"guess": GuessNumberEnv()})
        self.observed: list[dict] = []

    def draw_weights(self, counts):
        self.observed.append(dict(counts))
        return super().draw_weights(counts)


def test_a_mixtures_draws_see_the_buffers_accounting(engines, tokenizer):
    env = RecordsAccounting()
    engine = engines.engine(malformed_guess)
    buffer = RolloutBuffer(capacity=8, max_version_gap=10)
    producer = engines.producer(engine, buffer, tokenizer, env=env, max_concurrent_groups=1)
    producer.start()
    wait_for(lambda: buffer.counts()["produced"] >= 6, "3 groups")
    producer.stop()
    # One call per group drawn, one group at a time: the first saw an empty buffer, each later one
    # the groups filed before it (2 episodes each).
    assert len(env.observed) >= 3
    assert [observed["produced"] for observed in env.observed[:3]] == [0, 2, 4]


@pytest.mark.parametrize("checkpoint_pending", [True, False])
def test_a_resumed_service_trains_the_stored_groups_and_numbers_new_ones_past_them(model_path, checkpoint_pending):
    first = make_service(model_path)
    for group_id in (5, 9):
        assert first.buffer.try_reserve(2)
        first.buffer.put_group(group_with_versions(group_id, [[3], [4]]), reserved=2)
    state = first.state_dict()
    assert [[episode["group_id"] for episode in group] for group in state["accounting"]["pending_groups"]] == [
        [5, 5],
        [9, 9],
    ]
    assert state["in_flight"] == []  # not started: nothing in flight
    episodes = groups_to_state([[Trajectory(group_id=12), Trajectory(group_id=12)]])[0]
    state["in_flight"] = [
        {"group_id": 12, "instance": pickle.dumps(4), "seeds": [1, 2], "episodes": episodes}
    ]  # as a running service records it
    # The resumed run's own setting decides: false counts them as dropped at the restart.
    resumed = make_service(model_path, checkpoint_pending=checkpoint_pending)
    resumed.load_state_dict(state)
    if checkpoint_pending:  # new ids past the group in flight too, which lane 0 continues first
        assert (resumed.buffer.pending, resumed.buffer.dropped["restart"], next(resumed._group_ids)) == (4, 0, 13)
        assert resumed._resumed == state["in_flight"] and resumed.buffer.counts()["resumed_trained"] == 0
    else:
        assert (resumed.buffer.pending, resumed.buffer.dropped["restart"], next(resumed._group_ids)) == (0, 4, 0)
    assert resumed.buffer.accounting_holds()
    # A run that does not keep them writes none.
    assert "pending_groups" not in make_service(model_path, checkpoint_pending=False).state_dict()["accounting"]


async def finishing_turn(engine, prompt_ids, on_tokens):
    """Answers ";" (the guess is malformed: the episode ends after this turn)."""
    on_tokens([SEMI], [-0.75])
    return TurnOutput([SEMI], [-0.75], [engine.version], "stop")


def continue_group(engines, tokenizer, state: dict, version: int):
    """A resumed producer on an engine at `version` continues the recorded group: (the engine's requests up to
    the group's filing, producer, the group as filed). The buffer holds one group, so no new group starts
    (and asks the engine) until the continued one is taken."""
    engine = engines.engine(finishing_turn)
    engine.version = version
    buffer = RolloutBuffer(capacity=2, max_version_gap=10)
    producer = engines.producer(engine, buffer, tokenizer, max_concurrent_groups=1)
    producer.resumed_groups = [state]
    producer.start()
    wait_for(lambda: buffer.pending >= 2, "the continued group filed")
    requests = list(engine.requests)
    return requests, producer, buffer.take(1, timeout_s=1)[0]


def test_groups_in_flight_at_a_checkpoint_are_continued_by_the_resumed_producer(engines, tokenizer):
    events: list[asyncio.Event] = []
    engine = engines.engine(blocking_turn(events))
    first = engines.producer(engine, RolloutBuffer(capacity=8, max_version_gap=3), tokenizer, max_concurrent_groups=1)
    first.start()
    wait_for(lambda: len(engine.requests) == 2, "one group blocked in its first turn")

    async def read():
        return first.in_flight_state()

    (state,) = engine.run(read())  # on the engine's loop, as a checkpoint reads it
    # "a" was streaming (its version not final yet): the checkpoint keeps the prompt only
    assert [episode["token_ids"] for episode in state["episodes"]] == [[BOS, QUESTION]] * 2
    first.stop()

    # The resumed run: its engine at version 5 plays the turn again; the group keeps its id and instance.
    requests, second, continued = continue_group(engines, tokenizer, state, version=5)
    assert [t.group_id for t in continued] == [state["group_id"]] * 2
    for trajectory in continued:
        assert trajectory.token_ids == [BOS, QUESTION, SEMI] and trajectory.versions == [-1, -1, 5]
    assert requests[0]["prompt"] == [BOS, QUESTION]
    assert second.stats.resumed_episodes == 2 and second.resumed_groups == []


def test_an_episode_that_had_ended_before_the_checkpoint_is_kept_as_it_was(engines, tokenizer):
    ended = Trajectory(group_id=7)
    ended.extend_context([BOS, QUESTION])
    ended.extend_policy([LETTER_A, SEMI], [-0.5, -0.25], [2, 2])
    ended.num_turns, ended.turn_starts, ended.committed, ended.finished, ended.reward = 1, [2], 4, True, 0.5
    waiting = Trajectory(group_id=7)
    waiting.extend_context([BOS, QUESTION])
    waiting.committed = 2
    state = {
        "group_id": 7,
        "instance": pickle.dumps(4),
        "seeds": [1, 2],
        "episodes": groups_to_state([[ended, waiting]])[0],
    }
    requests, _, (first, second) = continue_group(engines, tokenizer, state, version=3)
    assert (first.token_ids, first.versions, first.reward) == (
        [BOS, QUESTION, LETTER_A, SEMI],
        [-1, -1, 2, 2],
        0.5,
    )  # not played again
    assert (second.token_ids, second.versions) == ([BOS, QUESTION, SEMI], [-1, -1, 3])
    assert len(requests) == 1  # only the episode in flight asked the engine
