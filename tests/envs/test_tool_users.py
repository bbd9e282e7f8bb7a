"""Tool tasks with a user who answers back, and graded endings: hand-written model turns played through
`play_scripted` (vLLM's Hermes parser reads them), every expected value written out."""

from __future__ import annotations

import dataclasses

import pytest

from lit_asyncrl.envs.tools import Ending, Grade, ToolEnv, ToolMessage, UserMessage
from lit_asyncrl.envs.users import Message, SimulatedUser
from lit_asyncrl.rollout import play_scripted
from tests.support.shopping_task import ShoppingTask, add
from tests.support.xdist_groups import imports_vllm

pytestmark = imports_vllm

DONE = "Done. Anything else?"


def test_the_user_answers_a_turn_without_a_call_and_ends_the_conversation():
    task = ShoppingTask()
    play = play_scripted(task, ("mug", "hat"), [add("mug"), DONE, add("hat"), DONE, add("cup")])
    assert (play.reward, play.success, play.ended) == (1.0, True, True)
    answers = [[without_call_id(answer) for answer in answers] for _, answers in play.exchanges]
    assert answers == [
        [ToolMessage("1 in the basket", "add")],
        [UserMessage("add a hat")],  # the script's one follow-up request
        [ToolMessage("2 in the basket", "add")],
        [],  # the script is said: the user ends the conversation; the fifth turn is never played
    ]
    assert [ending.reason for ending in task.endings] == ["user_ended"]
    call = {"type": "function", "function": {"name": "add", "arguments": {"item": "mug"}}}
    hat = {"type": "function", "function": {"name": "add", "arguments": {"item": "hat"}}}
    assert without_ids(play.transcript) == [
        {"role": "user", "content": "add a mug"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "1 in the basket", "name": "add"},
        {"role": "assistant", "content": DONE},
        {"role": "user", "content": "add a hat"},
        {"role": "assistant", "content": "", "tool_calls": [hat]},
        {"role": "tool", "content": "2 in the basket", "name": "add"},
        {"role": "assistant", "content": DONE},
    ]
    assert task.endings[0].instance == ("mug", "hat") and task.endings[0].transcript == play.transcript


def without_call_id(answer):
    """vLLM's parser gives each call a random id: compared without it."""
    return dataclasses.replace(answer, call_id=None) if isinstance(answer, ToolMessage) else answer


def without_ids(transcript: list[dict]) -> list[dict]:
    messages = []
    for message in transcript:
        message = {key: value for key, value in message.items() if key != "tool_call_id"}
        if "tool_calls" in message:
            message["tool_calls"] = [{k: v for k, v in call.items() if k != "id"} for call in message["tool_calls"]]
        messages.append(message)
    return messages


class EchoUser(SimulatedUser):
    """A plain (not async) reply, recording what the user was shown."""

    def __init__(self) -> None:
        self.shown: list[list[Message]] = []

    def reply(self, goal, conversation):
        self.shown.append(list(conversation))
        return None if len(self.shown) == 2 else f"you said {conversation[-1].text!r}"


def test_a_plain_user_sees_only_the_talk_not_the_calls():
    user = EchoUser()
    play = play_scripted(ShoppingTask(user=user), ("mug", "hat"), [add("mug"), "ok", "bye"])
    assert play.exchanges[1][1] == [UserMessage("you said 'ok'")]
    assert user.shown == [
        [Message("user", "add a mug"), Message("agent", "ok")],
        [
            Message("user", "add a mug"),
            Message("agent", "ok"),
            Message("user", "you said 'ok'"),
            Message("agent", "bye"),
        ],
    ]
    assert (play.reward, play.success) == (0.5, False)  # the mug alone


def test_the_turn_limit_is_the_instances_and_its_cut_off_is_graded():
    task = ShoppingTask()
    play = play_scripted(task, ("mug",), [add("mug"), add("mug"), add("mug")])  # two turns for one item
    assert len(play.exchanges) == 2 and play.ended
    assert [ending.reason for ending in task.endings] == ["turns"] and task.endings[0].cut_off
    assert (play.reward, play.success) == (1.0, True)


@pytest.mark.parametrize("reason", ["context", "timeout"])
def test_a_run_cut_off_is_graded_with_its_reason_by_a_task_that_opts_in(reason):
    task = ShoppingTask(grades_cut_offs=True)
    play = play_scripted(task, ("mug", "hat"), [add("mug")], cut_off=reason)
    assert [ending.reason for ending in task.endings] == [reason]
    assert (play.reward, play.success, play.ended) == (0.5, False, True)  # the mug of two: half the reward


def test_a_task_that_does_not_grade_cut_offs_keeps_its_reward_at_the_penalties():
    task = ShoppingTask(grades_cut_offs=False, call_error_reward=-0.25)
    play = play_scripted(
        task, ("mug", "hat"), [add("mug"), '<tool_call>{"name": "remove"}</tool_call>'], cut_off="context"
    )
    assert task.endings == [] and (play.reward, play.success) == (-0.25, False)  # the failed call's penalty alone


class NoGoal(ToolEnv):
    def generate_instance(self, rng):
        return 0

    def new_state(self, instance):
        return None

    def tools(self, state):
        return []

    def opening(self, instance):
        return [{"role": "user", "content": "hi"}]

    def grade(self, ending: Ending) -> Grade:
        return Grade(0.0, False)


def test_a_user_without_a_goal_is_refused_when_the_task_is_built():
    with pytest.raises(ValueError, match=r"^env.user is set but NoGoal has no user_goal\(state\)"):
        NoGoal(user=EchoUser())
    assert NoGoal().user is None  # without a user a turn without a call ends the episode
    assert play_scripted(NoGoal(), 0, ["hello", "again"]).exchanges == [("hello", [])]
