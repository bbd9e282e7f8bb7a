"""A tool task's user in every rendering, and episodes the run cuts off, played by the episode runner.

The expected texts are written out; tokenizers as in test_tool_call_format.py (the character tokenizer
for the compact rendering, ChatML for the Hermes fallback, a Qwen2.5-like template that renders tools).
"""

from __future__ import annotations

import pytest

from lit_asyncrl.envs.tools import AssistantTurn, ToolMessage, UserMessage
from lit_asyncrl.models.char_tokenizer import build_char_tokenizer
from lit_asyncrl.rollout.episodes.env_calls import EnvCaller
from lit_asyncrl.rollout.episodes.for_task import episode_format_for
from lit_asyncrl.rollout.episodes.runner import EpisodeSettings, play_episode
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.records import Trajectory
from tests.support.chat_templates import CHATML, TOOLS_TEMPLATE, chat_tokenizer
from tests.support.scripted_engine import ids, scripted_engine
from tests.support.shopping_task import ShoppingTask, add
from tests.support.xdist_groups import imports_vllm

pytestmark = imports_vllm


def after_a_turn(tokenizer, episode_format, answers) -> str:
    """The text appended after an agent turn without a call (`Done.`, closed as the rendering closes a turn)."""
    trajectory = Trajectory(group_id=0)
    episode_format.open(trajectory, ShoppingTask().new_episode(("mug", "hat")).reset())
    turn = episode_format.demonstrated_turn_ids(AssistantTurn("Done."))
    trajectory.extend_policy(turn, [0.0] * len(turn), [0] * len(turn))
    before = len(trajectory.token_ids)
    episode_format.add_observation(trajectory, answers)
    return tokenizer.decode(trajectory.token_ids[before:], skip_special_tokens=False)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, "add a hat\n"),  # the compact rendering: a line, as the opening's request was
        (CHATML, "\n<|im_start|>user\nadd a hat<|im_end|>\n<|im_start|>assistant\n"),  # the Hermes fallback
        (TOOLS_TEMPLATE, "\n<|im_start|>user\nadd a hat<|im_end|>\n<|im_start|>assistant\n"),
    ],
    ids=["compact", "hermes_fallback", "template_with_tools"],
)
def test_the_users_answer_is_a_user_message_in_every_rendering(template, expected):
    tokenizer = build_char_tokenizer() if template is None else chat_tokenizer(template)
    episode_format = episode_format_for(tokenizer, ShoppingTask())
    assert after_a_turn(tokenizer, episode_format, [UserMessage("add a hat")]) == expected


def test_tool_answers_still_travel_in_tool_responses_in_the_fallback():
    tokenizer = chat_tokenizer(CHATML)
    episode_format = episode_format_for(tokenizer, ShoppingTask())
    assert after_a_turn(tokenizer, episode_format, [ToolMessage("1 in the basket", "add")]) == (
        "\n<|im_start|>user\n<tool_response>\n1 in the basket\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def play(tokenizer, engine, env, max_context: int = 8192) -> Trajectory:
    caller = EnvCaller(max_workers=1)
    try:
        settings = EpisodeSettings(
            call_env=caller, sampling=SamplingSettings(temperature=1.0, top_k=-1), max_context=max_context
        )
        episode = play_episode(
            engine, env, episode_format_for(tokenizer, env), ("mug", "hat"), Trajectory(group_id=0), settings
        )
        return engine.run(episode, timeout_s=30)
    finally:
        caller.close()
        engine.shutdown()


END = "<|im_end|>"
TURNS = [add("mug") + END, "Done." + END, add("hat") + END, "Done." + END]


def test_a_played_conversation_trains_on_exactly_the_ids_the_engine_saw():
    tokenizer, task = chat_tokenizer(CHATML), ShoppingTask()
    engine = scripted_engine(tokenizer, TURNS)
    trajectory = play(tokenizer, engine, task)
    assert trajectory.env_failure is None, trajectory.env_failure_message
    assert (trajectory.reward, trajectory.success, trajectory.num_turns, trajectory.cut_off) == (1.0, True, 4, None)
    assert [ending.reason for ending in task.endings] == ["user_ended"]
    policy = [token for token, mine in zip(trajectory.token_ids, trajectory.loss_mask) if mine]
    assert tokenizer.decode(policy, skip_special_tokens=False) == "".join(TURNS)
    for request in engine.requests:
        assert trajectory.token_ids[: len(request["prompt"])] == request["prompt"]
    text = tokenizer.decode(trajectory.token_ids, skip_special_tokens=False)
    assert "Done.<|im_end|>\n<|im_start|>user\nadd a hat<|im_end|>\n<|im_start|>assistant\n" + TURNS[2] in text


def context_for_one_turn(tokenizer) -> int:
    """Positions for the opening, the first turn and its answer: the context is full after them."""
    opened = Trajectory(group_id=0)
    episode_format = episode_format_for(tokenizer, ShoppingTask())
    episode_format.open(opened, ShoppingTask().new_episode(("mug", "hat")).reset())
    answer = "\n<|im_start|>user\n<tool_response>\n1 in the basket\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    return len(opened.token_ids) + len(ids(tokenizer, TURNS[0])) + len(ids(tokenizer, answer))


@pytest.mark.parametrize(("grades_cut_offs", "reward", "endings"), [(True, 0.5, ["context"]), (False, 0.0, [])])
def test_an_episode_the_context_cut_off_is_graded_when_its_task_opts_in(grades_cut_offs, reward, endings):
    tokenizer, task = chat_tokenizer(CHATML), ShoppingTask(grades_cut_offs=grades_cut_offs)
    trajectory = play(tokenizer, scripted_engine(tokenizer, TURNS), task, context_for_one_turn(tokenizer))
    assert (trajectory.cut_off, trajectory.num_turns, trajectory.env_failure) == ("context", 1, None)
    assert [ending.reason for ending in task.endings] == endings
    assert (trajectory.reward, trajectory.success) == (reward, False)  # the mug of two when graded


def test_an_episode_past_its_timeout_is_graded_with_what_it_did():
    # Each add takes 0.5 s: the mug is in at 0.5 s, the hat's call is still running at the 0.75 s timeout.
    tokenizer = chat_tokenizer(CHATML)
    task = ShoppingTask(grades_cut_offs=True, slow_s=0.5, episode_timeout_s=0.75)
    trajectory = play(tokenizer, scripted_engine(tokenizer, TURNS), task)
    assert trajectory.timed_out and trajectory.env_failure is None
    assert [ending.reason for ending in task.endings] == ["timeout"]
    assert task.endings[0].state.items == ["mug"] and (trajectory.reward, trajectory.success) == (0.5, False)
