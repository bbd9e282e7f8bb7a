"""An episode in flight at a checkpoint continues after the resume: its recorded turns are replayed
into a fresh environment episode (not sampled again), sampling goes on in the middle of the turn
the checkpoint cut, and the recorded tokens keep their mu, versions and pi_old."""

from __future__ import annotations

import asyncio
import copy
import math

import pytest

from lit_asyncrl.envs import GuessNumberEnv
from lit_asyncrl.rollout.engine_protocol import TurnOutput
from lit_asyncrl.rollout.env_calls import EnvCaller
from lit_asyncrl.rollout.episode import play_episode
from lit_asyncrl.rollout.episode_format import PlainFormat
from lit_asyncrl.rollout.records import Trajectory
from tests.unit.conftest import BOS, QUESTION, SEMI

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
        settings = {"call_env": call_env, "temperature": 1.0, "top_k": -1, "max_context": 64, "seed": 11, "recorded": recorded}
        return asyncio.run(play_episode(engine, env, PlainFormat(tokenizer, env), 10, trajectory, **settings))
    finally:
        call_env.close()


def cut(trajectory: Trajectory, length: int, num_turns: int) -> Trajectory:
    """The trajectory as a checkpoint would have recorded it after `length` tokens and `num_turns` answered turns."""
    recorded = copy.deepcopy(trajectory)
    for name in ("token_ids", "loss_mask", "behavior_logprobs", "versions", "old_logprobs", "old_versions"):
        setattr(recorded, name, getattr(recorded, name)[:length])
    recorded.num_turns, recorded.reward, recorded.success = num_turns, 0.0, False
    return recorded


def test_a_turn_cut_by_the_checkpoint_is_continued_and_the_recorded_tokens_keep_their_values(tokenizer):
    # Secret 10: "5;" -> H, "8;" -> H, "10;" -> W. The checkpoint caught the third turn after "1".
    whole = play(ScriptedEngine([[FIVE, SEMI], [EIGHT, SEMI], [ONE, ZERO, SEMI]], version=0), tokenizer)
    assert whole.token_ids == [BOS, QUESTION, FIVE, SEMI, HIGHER, EIGHT, SEMI, HIGHER, ONE, ZERO, SEMI] and whole.success
    whole.versions[2:4], whole.versions[5:7], whole.versions[8] = [0, 0], [1, 1], 2  # as sampled, over three versions
    whole.old_logprobs[5] = -0.75  # a pi_old an exact route had attached
    whole.old_versions[5] = 1
    recorded = cut(whole, length=9, num_turns=2)

    engine = ScriptedEngine([[ZERO, SEMI]], version=7)  # the resumed run's engine, at the checkpoint's version
    resumed = play(engine, tokenizer, recorded)
    # One request only: the rest of the third turn, after its recorded "1", in what is left of the turn.
    assert engine.requests == [([BOS, QUESTION, FIVE, SEMI, HIGHER, EIGHT, SEMI, HIGHER, ONE], GuessNumberEnv().max_turn_tokens - 1)]
    assert resumed.token_ids == whole.token_ids and resumed.loss_mask == whole.loss_mask
    assert resumed.versions == [-1, -1, 0, 0, -1, 1, 1, -1, 2, 7, 7]
    assert resumed.behavior_logprobs[:9] == whole.behavior_logprobs[:9] and resumed.behavior_logprobs[9:] == pytest.approx([-7.1, -7.2])
    assert resumed.old_logprobs[5] == -0.75 and resumed.old_versions[5] == 1 and math.isnan(resumed.old_logprobs[9])
    # The environment's answers were replayed: the same reward and outcome, three turns.
    assert (resumed.reward, resumed.success, resumed.num_turns, resumed.env_failure) == (1.0, True, 3, None)


def test_a_whole_recorded_turn_waiting_for_its_answer_is_not_sampled_again(tokenizer):
    whole = play(ScriptedEngine([[FIVE, SEMI], [EIGHT, SEMI], [ONE, ZERO, SEMI]], version=0), tokenizer)
    recorded = cut(whole, length=7, num_turns=2)  # "8;" answered by the engine, the environment's answer not yet in
    engine = ScriptedEngine([[ONE, ZERO, SEMI]], version=4)
    resumed = play(engine, tokenizer, recorded)
    assert [prompt for prompt, _ in engine.requests] == [whole.token_ids[:8]]  # only the third turn was sampled
    assert resumed.token_ids == whole.token_ids and resumed.success


def test_an_environment_that_answers_otherwise_fails_the_episode_as_restart(tokenizer):
    whole = play(ScriptedEngine([[FIVE, SEMI], [EIGHT, SEMI], [ONE, ZERO, SEMI]], version=0), tokenizer)
    recorded = cut(whole, length=9, num_turns=2)
    recorded.token_ids[4] = WON  # the recording says the first guess won; the environment says H
    engine = ScriptedEngine([[ZERO, SEMI]], version=7)
    resumed = play(engine, tokenizer, recorded)
    assert resumed.env_failure == "restart" and "answered otherwise" in resumed.env_failure_message
    assert engine.requests == []  # stopped at the first answer that differs, before any sampling
