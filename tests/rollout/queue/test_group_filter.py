"""Groups without a learning signal and episodes cut off (`rollout/queue/group_filter.py`): hand-made groups
through the buffer, episodes cut by the context and by the turn limit, and a synchronous producer that
replaces the groups the filter dropped. No vLLM engine is started."""

from __future__ import annotations

import asyncio

import pytest

from lit_asyncrl.envs import GuessNumberEnv
from lit_asyncrl.envs.guess_number import GuessNumberEpisode
from lit_asyncrl.rollout.engine.protocol import TurnOutput
from lit_asyncrl.rollout.episodes.env_calls import EnvCaller
from lit_asyncrl.rollout.episodes.formats import PlainFormat
from lit_asyncrl.rollout.episodes.runner import EpisodeSettings, play_episode
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.queue.advantages import GroupNormalized
from lit_asyncrl.rollout.queue.buffer import RolloutBuffer
from lit_asyncrl.rollout.queue.group_filter import GroupFilter
from lit_asyncrl.rollout.records import Trajectory, collate
from lit_asyncrl.rollout.settings import RolloutConfig
from tests.support.fakes import malformed_guess
from tests.support.polling import holds_for, wait_for
from tests.support.tiny_policy import BOS, QUESTION, SEMI


def group(group_id: int, rewards: list[float], cut_off: list[str | None] | None = None) -> list[Trajectory]:
    """A finished group: one policy token each, the rewards given, GRPO advantages."""
    trajectories = []
    for reward, advantage, cut in zip(rewards, GroupNormalized()(rewards), cut_off or [None] * len(rewards)):
        trajectory = Trajectory(group_id=group_id, reward=reward, advantage=advantage, cut_off=cut)
        trajectory.extend_context([BOS])
        trajectory.extend_policy([SEMI], [-0.5], [0])
        trajectories.append(trajectory)
    return trajectories


def put(buffer: RolloutBuffer, trajectories: list[Trajectory]) -> bool:
    assert buffer.try_reserve(len(trajectories))
    return buffer.put_group(trajectories, reserved=len(trajectories))


def test_groups_without_signal_are_dropped_up_to_the_cap_per_batch_then_trained_and_counted():
    buffer = RolloutBuffer(
        capacity=64, max_version_gap=3, group_filter=GroupFilter(zero_advantage=True, max_drops_per_batch=2)
    )
    assert put(buffer, group(0, [0.0, 0.0])) is False  # all failed: no signal, dropped
    assert put(buffer, group(1, [1.0, 0.0])) is True
    assert put(buffer, group(2, [1.0, 1.0])) is False  # all succeeded: dropped too (the second drop)
    assert put(buffer, group(3, [0.0, 0.0])) is True  # the cap: trained as it is, counted
    assert [g[0].group_id for g in buffer.take(2, timeout_s=1)] == [1, 3]
    assert put(buffer, group(4, [0.5, 0.5])) is False  # a new batch: dropping again
    counts = buffer.counts()
    assert {key: counts[key] for key in ("produced", "trained", "dropped", "dropped_zero_advantage", "pending", "zero_advantage_kept")} == {
        "produced": 10, "trained": 4, "dropped": 6, "dropped_zero_advantage": 6, "pending": 0, "zero_advantage_kept": 2,
    }  # fmt: skip
    assert buffer.accounting_holds()


def test_a_cap_of_zero_drops_nothing_and_the_filter_off_neither_drops_nor_adds_counts():
    capped = RolloutBuffer(
        capacity=8, max_version_gap=3, group_filter=GroupFilter(zero_advantage=True, max_drops_per_batch=0)
    )
    assert put(capped, group(0, [0.0, 0.0])) is True and capped.counts()["zero_advantage_kept"] == 2
    default = RolloutBuffer(capacity=8, max_version_gap=3)
    assert put(default, group(0, [0.0, 0.0])) is True
    assert default.counts() == {"produced": 2, "trained": 0, "dropped": 0, "dropped_stale": 0, "pending": 2}


def test_episodes_cut_off_stay_in_their_group_but_out_of_the_loss_and_are_counted():
    buffer = RolloutBuffer(capacity=8, max_version_gap=3, group_filter=GroupFilter(overlong=True))
    trajectories = group(0, [1.0, 0.0, 0.0], cut_off=[None, "turns", "context"])
    assert put(buffer, trajectories) is True
    assert [t.in_loss for t in trajectories] == [True, False, False] and buffer.counts()["masked_overlong"] == 2
    batch = collate(buffer.take(1, timeout_s=1)[0], pad_id=0)
    assert batch["loss_mask"].tolist() == [[False, True], [False, False], [False, False]]
    # The cut episodes' rewards still count in the group: 1.0 against two 0.0 (std 0.4714).
    assert batch["advantages"][:, 1].tolist() == pytest.approx([1.4142, 0.0, 0.0], abs=1e-4)


def test_the_filters_counts_survive_a_resume():
    buffer = RolloutBuffer(
        capacity=8,
        max_version_gap=3,
        group_filter=GroupFilter(zero_advantage=True, max_drops_per_batch=0, overlong=True),
    )
    put(buffer, group(0, [0.0, 0.0], cut_off=["turns", None]))
    resumed = RolloutBuffer(capacity=8, max_version_gap=3, group_filter=buffer.group_filter)
    resumed.load_state_dict(buffer.state_dict(keep_pending=False))
    assert (resumed.zero_advantage_kept, resumed.masked_overlong, resumed.dropped["restart"]) == (2, 1, 2)


def test_settings_are_checked_and_build_the_filter():
    assert RolloutConfig().filters.group_filter() == GroupFilter(
        zero_advantage=False, max_drops_per_batch=16, overlong=False
    )
    assert RolloutConfig.from_keys(
        filter_zero_advantage=True, max_zero_advantage_drops_per_batch=4
    ).filters.group_filter() == GroupFilter(True, 4, False)
    with pytest.raises(ValueError, match=r"^rollout\.filter_overlong must be true or false, got 'yes'$"):
        RolloutConfig.from_keys(filter_overlong="yes")
    with pytest.raises(
        ValueError, match=r"^rollout\.max_zero_advantage_drops_per_batch must be an integer >= 0, got -1$"
    ):
        RolloutConfig.from_keys(max_zero_advantage_drops_per_batch=-1)


class Typist:
    """Writes `text_ids` at every turn, at most `max_tokens` of them ("length" when cut short)."""

    version = 0

    def __init__(self, text_ids: list[int]) -> None:
        self.text_ids = text_ids

    async def generate(self, prompt_ids, *, max_tokens, temperature, top_k=-1, stop_token_ids=(), on_tokens=None, **_):
        ids = self.text_ids[:max_tokens]
        on_tokens(ids, [-0.1] * len(ids))
        return TurnOutput(
            ids, [-0.1] * len(ids), [0] * len(ids), "stop" if len(ids) == len(self.text_ids) else "length"
        )


class EndlessGuessing(GuessNumberEnv):
    """Guess-the-number whose episodes never end by themselves: only the runner's turn limit stops them."""

    def new_episode(self, instance: int) -> GuessNumberEpisode:
        return GuessNumberEpisode(instance, self.max_value, 1_000, self.malformed_reward)


def played(env, tokenizer, max_context: int) -> Trajectory:
    five = tokenizer.encode("5", add_special_tokens=False)
    caller = EnvCaller(max_workers=1)
    try:
        settings = EpisodeSettings(
            call_env=caller, sampling=SamplingSettings(temperature=1.0, top_k=-1), max_context=max_context
        )
        return asyncio.run(
            play_episode(Typist([*five, SEMI]), env, PlainFormat(tokenizer, env), 9, Trajectory(group_id=0), settings)
        )
    finally:
        caller.close()


def test_where_the_runner_cut_an_episode_is_recorded(tokenizer):
    # <bos> ? | 5 ; | H ... : the prompt is 2 tokens, a turn 2, an answer 1 (the secret 9 is higher).
    assert played(GuessNumberEnv(max_turns=2), tokenizer, max_context=64).cut_off is None  # the game's own end
    endless = EndlessGuessing(max_turns=2)
    assert played(endless, tokenizer, max_context=64).cut_off == "turns"
    cut = played(endless, tokenizer, max_context=5)  # after one turn and its answer the context is full
    assert (cut.cut_off, cut.num_turns, cut.token_ids[:2]) == ("context", 1, [BOS, QUESTION])
    half = played(endless, tokenizer, max_context=3)  # room for 1 of the turn's 2 tokens: "5" alone is malformed
    assert (half.cut_off, half.num_turns, half.reward) == ("context", 1, pytest.approx(-0.2))


def test_a_synchronous_producer_replaces_the_groups_the_filter_dropped(engines, tokenizer):
    # Every episode writes "a;" (malformed, reward -0.2): no group carries a signal. One drop per
    # batch: the first group of a version is dropped and replaced, the next kept at the cap.
    engine = engines.engine(malformed_guess)
    buffer = RolloutBuffer(
        capacity=1000, max_version_gap=10, group_filter=GroupFilter(zero_advantage=True, max_drops_per_batch=1)
    )
    producer = engines.producer(engine, buffer, tokenizer, groups_per_version=2)
    producer.start()
    wait_for(lambda: buffer.counts()["zero_advantage_kept"] == 4, "two groups kept at version 0")
    assert holds_for(lambda: producer.groups_started == 3 and producer.groups_refilled == 1 and buffer.produced == 6)
    assert buffer.counts()["dropped_zero_advantage"] == 2 and buffer.accounting_holds()
