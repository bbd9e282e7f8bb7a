"""Tool-call arguments checked strictly or leniently (`env.arguments`): hand-written calls against a
schema with an integer, a number and a string; the lenient check takes a number's exact JSON text in a
string and counts it, nothing else."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from lit_asyncrl.envs.tools import AssistantTurn, Ending, Grade, Tool, ToolCall, ToolEnv
from lit_asyncrl.envs.tools.arguments import LenientArguments, StrictArguments
from lit_asyncrl.rollout.records import Trajectory

SCHEMA = {
    "type": "function",
    "function": {
        "name": "refund",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "integer"}, "amount": {"type": "number"}, "note": {"type": "string"}},
            "required": ["order_id"],
        },
    },
}
TOOL = Tool(SCHEMA, lambda order_id, amount=0.0, note="": f"refunded {order_id}: {amount!r}")


def test_strict_takes_the_schema_as_written():
    assert StrictArguments().check(TOOL, {"order_id": 12}).arguments == {"order_id": 12}
    refused = StrictArguments().check(TOOL, {"order_id": "12"})
    assert (refused.arguments, refused.problem) == (None, "'12' is not of type 'integer'")


@pytest.mark.parametrize(
    ("arguments", "taken", "coerced"),
    [
        ({"order_id": "12"}, {"order_id": 12}, ("order_id",)),
        ({"order_id": "-3", "amount": "2.5"}, {"order_id": -3, "amount": 2.5}, ("amount", "order_id")),
        ({"order_id": 7, "amount": "4"}, {"order_id": 7, "amount": 4}, ("amount",)),
        ({"order_id": 7, "note": "12"}, {"order_id": 7, "note": "12"}, ()),  # valid as written: nothing taken
    ],
)
def test_lenient_takes_a_numbers_exact_json_text(arguments, taken, coerced):
    checked = LenientArguments().check(TOOL, arguments)
    assert (checked.arguments, checked.problem, checked.coerced) == (taken, None, coerced)
    assert all(type(checked.arguments[name]) is type(taken[name]) for name in taken)


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"order_id": "12.0"}, "'12.0' is not of type 'integer'"),  # not an integer's text
        ({"order_id": " 12"}, "' 12' is not of type 'integer'"),  # would not write back the same
        ({"order_id": "012"}, "'012' is not of type 'integer'"),  # no JSON number
        ({"order_id": "true"}, "'true' is not of type 'integer'"),
        ({"order_id": 1, "amount": "1e3"}, "'1e3' is not of type 'number'"),  # 1000.0 writes back as 1000.0
        # The number was not what was wrong: the schema's own message for the call as written stands.
        ({"order_id": "12", "note": 5}, "'12' is not of type 'integer'"),
        ({"amount": "2"}, "'order_id' is a required property"),
    ],
)
def test_lenient_refuses_what_would_lose_or_change_anything(arguments, problem):
    checked = LenientArguments().check(TOOL, arguments)
    assert (checked.arguments, checked.problem, checked.coerced) == (None, problem, ())


class Refunds(ToolEnv):
    def generate_instance(self, rng: random.Random) -> int:
        return 12

    def new_state(self, instance: int) -> list:
        return []

    def tools(self, state: list) -> list:
        return [Tool(SCHEMA, lambda order_id, amount=0.0, note="": state.append(order_id) or f"refunded {order_id}")]

    def opening(self, instance: int) -> list[dict]:
        return [{"role": "user", "content": f"refund order {instance}"}]

    def grade(self, ending: Ending) -> Grade:
        return Grade(float(ending.state == [12]), ending.state == [12])


def one_call(arguments: str, arguments_check: str):
    episode = Refunds(arguments=arguments_check).new_episode(12)
    episode.reset()
    turn = AssistantTurn("", (ToolCall("refund", {"order_id": arguments}),))
    return asyncio.run(episode.step(turn))


def test_a_lenient_task_calls_the_tool_with_the_number_and_counts_it_by_tool():
    transition = one_call("12", "lenient")
    (answer,) = transition.observation
    assert (answer.content, answer.error, answer.coerced) == ("refunded 12", None, ("order_id",))
    assert transition.info["tool_call_coercions"] == {"refund": 1}
    assert transition.info["tool_call_errors"] == {}
    trajectory = Trajectory(group_id=0)
    trajectory.record_step_info(transition.info)
    assert trajectory.tool_call_coercions == Counter({"refund": 1})
    strict = one_call("12", "strict")
    assert [answer.error for answer in strict.observation] == ["invalid_arguments"]
    assert strict.info["tool_call_coercions"] == {}


def test_an_unknown_arguments_check_is_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"env.arguments must be one of strict, lenient, got 'loose'"):
        Refunds(arguments="loose")
