"""An episode in flight at a checkpoint continues after the resume: its answered turns are replayed
into a fresh environment episode (not sampled again), a turn still streaming is sampled again, and
the recorded tokens keep their mu, versions and pi_old."""

from __future__ import annotations

import asyncio
import copy
import math

import pytest

from lit_asyncrl.envs import GuessNumberEnv
from lit_asyncrl.rollout.engine.protocol import TurnOutput
from lit_asyncrl.rollout.episodes.env_calls import EnvCaller
from lit_asyncrl.rollout.episodes.formats import PlainFormat
from lit_asyncrl.rollout.episodes.replay import committed_part
from lit_asyncrl.rollout.episodes.runner import EpisodeSettings, play_episode
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.records import Trajectory
from tests.support.tiny_policy import BOS, QUESTION, SEMI

# Character c has id ord(c) - 27 in the tiny policy's vocabulary.
ONE, ZERO, FIVE, EIGHT, HIGHER, WON = (ord(c) - 27 for c in "1058HW")


class ScriptedEngine:
    """Answers each request with the next scripted turn (ids, one mu each), at its own version."""

    def __init__(self, turns: list[list[int]], version: int) -> None:
        self.turns, self.version, self.requests = list(turns), version, []

    async def generate(self, prompt_ids, *, max_tokens, temperature, top_k=-1, stop_token_ids=(), on_tokens=None):
        self.requests.append((list(prompt_ids), max_tokens))
        ids = self.turns.pop(0)
        logprobs = [-0.1 * (index + 1) - self.version for index in range(len(ids))]
        on_tokens(ids, logprobs)
        return TurnOutput(ids, logprobs, [self.version] * len(ids), "stop")


def play(engine, tokenizer, recorded: Trajectory | None = None) -> Trajectory:
    env = GuessNumberEnv()
    call_env = EnvCaller(max_workers=1)
    try:
        trajectory = Trajectory(group_id=3)
        sampling = SamplingSettings(temperature=1.0, top_k=-1)
        settings = EpisodeSettings(call_env=call_env, sampling=sampling, max_context=64, seed=11, recorded=recorded)
        return asyncio.run(play_episode(engine, env, PlainFormat(tokenizer, env), 10, trajectory, settings))
    finally:
        call_env.close()


def in_flight(trajectory: Trajectory, streamed: int, committed: int, num_turns: int) -> Trajectory:
    """The episode as it stood in flight: `streamed` tokens so far, of which `committed` final, and
    `num_turns` turns answered by the engine."""
    state = copy.deepcopy(trajectory)
    for name in ("token_ids", "loss_mask", "behavior_logprobs", "versions", "old_logprobs", "old_versions"):
        setattr(state, name, getattr(state, name)[:streamed])
    state.committed, state.num_turns, state.finished = committed, num_turns, False
    state.reward, state.success = 0.0, False
    return state


def test_answered_turns_are_replayed_with_their_values_and_a_turn_still_streaming_is_sampled_again(tokenizer):
    # Secret 10: "5;" -> H, "8;" -> H, "10;" -> W. The checkpoint caught the third turn after "1",
    # whose version is provisional until the turn ends: only the first 8 tokens are final.
    whole = play(ScriptedEngine([[FIVE, SEMI], [EIGHT, SEMI], [ONE, ZERO, SEMI]], version=0), tokenizer)
    assert (
        whole.token_ids == [BOS, QUESTION, FIVE, SEMI, HIGHER, EIGHT, SEMI, HIGHER, ONE, ZERO, SEMI] and whole.success
    )
    assert (whole.turn_starts, whole.committed, whole.finished) == ([2, 5, 8], 11, True)
    whole.versions[2:4], whole.versions[5:7] = [0, 0], [1, 1]  # as sampled, over two versions
    whole.old_logprobs[5], whole.old_versions[5] = -0.75, 1  # a pi_old an exact route had attached
    recorded = committed_part(in_flight(whole, streamed=9, committed=8, num_turns=2))
    assert recorded.token_ids == whole.token_ids[:8] and recorded.turn_starts == [2, 5]

    engine = ScriptedEngine([[ONE, ZERO, SEMI]], version=7)  # the resumed run's engine, at the checkpoint's version
    resumed = play(engine, tokenizer, recorded)
    # One request: the third turn, whole, after the replayed context.
    assert engine.requests == [(whole.token_ids[:8], GuessNumberEnv().max_turn_tokens)]
    assert resumed.token_ids == whole.token_ids and resumed.loss_mask == whole.loss_mask
    assert resumed.versions == [-1, -1, 0, 0, -1, 1, 1, -1, 7, 7, 7]
    assert resumed.behavior_logprobs[:8] == whole.behavior_logprobs[:8] and resumed.behavior_logprobs[
        8:
    ] == pytest.approx([-7.1, -7.2, -7.3])
    assert resumed.old_logprobs[5] == -0.75 and resumed.old_versions[5] == 1 and math.isnan(resumed.old_logprobs[8])
    # The environment's answers were replayed: the same reward and outcome, three turns.
    assert (resumed.reward, resumed.success, resumed.num_turns, resumed.env_failure) == (1.0, True, 3, None)


def test_an_answered_turn_waiting_for_the_environment_is_not_sampled_again(tokenizer):
    whole = play(ScriptedEngine([[FIVE, SEMI], [EIGHT, SEMI], [ONE, ZERO, SEMI]], version=0), tokenizer)
    recorded = committed_part(in_flight(whole, streamed=7, committed=7, num_turns=2))  # "8;" answered, no answer yet
    engine = ScriptedEngine([[ONE, ZERO, SEMI]], version=4)
    resumed = play(engine, tokenizer, recorded)
    assert [prompt for prompt, _ in engine.requests] == [whole.token_ids[:8]]  # only the third turn was sampled
    assert resumed.token_ids == whole.token_ids and resumed.success


@pytest.mark.parametrize(
    ("position", "token"),
    [
        (4, WON),
        (8, EIGHT),
    ],  # the first answer said W (not H); the second answer was "H8" (longer than the replayed "H")
    ids=["another_answer", "a_longer_answer"],
)
def test_an_environment_that_answers_otherwise_fails_the_episode_as_restart(tokenizer, position, token):
    whole = play(ScriptedEngine([[FIVE, SEMI], [EIGHT, SEMI], [ONE, ZERO, SEMI]], version=0), tokenizer)
    recorded = committed_part(in_flight(whole, streamed=9, committed=8, num_turns=2))
    if token == EIGHT:  # one observation token more at the end of the recording
        recorded.extend_context([token])
    else:
        recorded.token_ids[position] = token
    engine = ScriptedEngine([[ONE, ZERO, SEMI]], version=7)
    resumed = play(engine, tokenizer, recorded)
    assert resumed.env_failure == "restart" and "otherwise" in resumed.env_failure_message
    assert engine.requests == []  # stopped at the first answer that differs, before any sampling


def test_an_episode_caught_before_its_first_answer_is_played_from_the_start(tokenizer):
    whole = play(ScriptedEngine([[FIVE, SEMI], [EIGHT, SEMI], [ONE, ZERO, SEMI]], version=0), tokenizer)
    recorded = committed_part(in_flight(whole, streamed=0, committed=0, num_turns=0))  # its reset still under way
    engine = ScriptedEngine([[FIVE, SEMI], [EIGHT, SEMI], [ONE, ZERO, SEMI]], version=2)
    resumed = play(engine, tokenizer, recorded)
    assert resumed.token_ids == whole.token_ids and resumed.env_failure is None and len(engine.requests) == 3
