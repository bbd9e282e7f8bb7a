"""Scripted model turns through a task without an engine (`lit_asyncrl.rollout.play_scripted`): a text task,
a tool task whose turns vLLM's Hermes parser reads, and a mixture's task; values worked out by hand."""

from __future__ import annotations

import random

from lit_asyncrl.envs import GuessNumberEnv, MixInstance, TaskMix
from lit_asyncrl.envs.tools import Ending, Grade, ToolEnv, ToolMessage
from lit_asyncrl.rollout import play_scripted
from tests.support.xdist_groups import imports_vllm


class Tally:
    def __init__(self) -> None:
        self.total = 0

    def add(self, amount: int) -> str:
        """Add to the total.

        Args:
            amount: How much to add.
        """
        self.total += amount
        return f"total {self.total}"


class TallyTask(ToolEnv):
    """Reach the instance's number with `add` calls; a turn without a call ends the episode."""

    def generate_instance(self, rng: random.Random) -> int:
        return 5

    def new_state(self, instance: int) -> Tally:
        return Tally()

    def tools(self, state: Tally) -> list:
        return [state.add]

    def opening(self, instance: int) -> list[dict]:
        return [{"role": "user", "content": f"reach {instance}"}]

    def grade(self, ending: Ending) -> Grade:
        return Grade(1.0 if ending.state.total == 5 else 0.0, ending.state.total == 5)


def call(amount: int) -> str:
    return f'<tool_call>{{"name": "add", "arguments": {{"amount": {amount}}}}}</tool_call>'


def test_a_text_task_takes_the_turns_as_written():
    # Secret 7: 5 is low (H), 8 high (L), 7 wins; the fourth turn is never played.
    play = play_scripted(GuessNumberEnv(), 7, ["5;", "8;", "7;", "1;"])
    assert (play.reward, play.success, play.ended, play.opening) == (1.0, True, True, "?")
    assert play.exchanges == [("5;", "H"), ("8;", "L"), ("7;", "W")]
    unfinished = play_scripted(GuessNumberEnv(), 7, ["5;"])
    assert (unfinished.reward, unfinished.success, unfinished.ended) == (0.0, False, False)


@imports_vllm
def test_a_tool_tasks_turns_are_read_by_the_tool_parser_and_graded_at_the_end():
    play = play_scripted(TallyTask(), 5, [call(2), f"Adding.{call(3)}", "Done: 5."])
    assert (play.reward, play.success, play.ended) == (1.0, True, True)
    assert play.opening.messages == ({"role": "user", "content": "reach 5"},)
    (first,) = play.exchanges[0][1]
    assert isinstance(first, ToolMessage) and (first.content, first.name) == ("total 2", "add")
    assert [answer.content for answer in play.exchanges[1][1]] == ["total 5"]
    assert play.exchanges[2] == ("Done: 5.", [])  # no call: the episode ends, graded
    short = play_scripted(TallyTask(), 5, [call(2), "Done."])
    assert (short.reward, short.success) == (0.0, False)


@imports_vllm
def test_a_mixtures_instance_is_played_by_its_own_task():
    mix = TaskMix({"tally": TallyTask(), "game": GuessNumberEnv()})
    assert play_scripted(mix, MixInstance("game", 3), ["3;"]).exchanges == [("3;", "W")]
    assert play_scripted(mix, MixInstance("tally", 5), [call(5), "ok"]).success
