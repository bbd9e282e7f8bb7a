"""The service desk in JSON tools: the text desk's rules and reward, reached through tool calls."""

from __future__ import annotations

import asyncio
import random

import pytest

from lit_asyncrl.envs import CooperativeUser, ServiceDeskToolsEnv
from lit_asyncrl.envs.service_desk.orders import DeskInstance, Order
from lit_asyncrl.envs.tools import AssistantTurn, ToolCall
from tests.support.xdist_groups import imports_vllm

pytestmark = imports_vllm

# Order 42 was delivered 12 days ago: the refund is due (window 30), the reply is "done".
DUE = DeskInstance(
    orders=(Order(42, "mug", "delivered", 12), Order(57, "hat", "placed", 3)), request="refund", order_id=42
)
# Order 42 was delivered 45 days ago: no refund, the reply is "no".
TOO_OLD = DeskInstance(orders=(Order(42, "mug", "delivered", 45),), request="refund", order_id=42)


def play(env, instance, turns: list[list[tuple[str, dict]]]):
    episode = env.new_episode(instance)
    opening = episode.reset()

    async def run():
        return [
            await episode.step(AssistantTurn("", tuple(ToolCall(name, arguments) for name, arguments in calls)))
            for calls in turns
        ]

    return opening, asyncio.run(run())


@pytest.mark.parametrize(
    ("instance", "turns", "reward", "success"),
    [
        (
            DUE,
            [[("look", {"order_id": 42})], [("refund", {"order_id": 42})], [("reply", {"message": "done"})]],
            1.0,
            True,
        ),
        (
            DUE,
            [[("look", {"order_id": 42})], [("reply", {"message": "done"})]],
            0.0,
            False,
        ),  # said done, refunded nothing
        (
            DUE,
            [[("refund", {"order_id": 57}), ("refund", {"order_id": 42})], [("reply", {"message": "done"})]],
            0.0,
            False,
        ),  # refunded another order too
        (TOO_OLD, [[("look", {"order_id": 42})], [("reply", {"message": "no"})]], 1.0, True),
        (TOO_OLD, [[("look", {"order_id": 99})], [("reply", {"message": "no"})]], 0.9, True),  # one failed call: -0.1
    ],
    ids=["refund due", "no refund made", "a second order refunded", "too old", "an unknown order first"],
)
def test_the_reward_is_the_text_desks_rule_on_the_final_state_and_reply(instance, turns, reward, success):
    _, steps = play(ServiceDeskToolsEnv(), instance, turns)
    assert steps[-1].terminated and steps[-1].success == success
    assert sum(step.reward for step in steps) == pytest.approx(reward)


def test_tool_answers_and_errors_are_the_desks():
    opening, steps = play(
        ServiceDeskToolsEnv(),
        DUE,
        [[("look", {"order_id": 42}), ("look", {"order_id": 99}), ("reply", {"message": "maybe"})]],
    )
    assert opening.messages == ({"role": "user", "content": "refund order 42"},)
    assert [(answer.content, answer.error) for answer in steps[0].observation] == [
        ("42 mug delivered 12d", None),
        ("Error: look failed: no order 99", "tool_error"),
        (
            "Error: invalid arguments for reply: 'maybe' is not one of ['done', 'no', 'placed', 'shipped', 'delivered', 'cancelled', 'refunded']",
            "invalid_arguments",
        ),
    ]
    assert not steps[0].done  # an invalid reply sends nothing: the conversation goes on


def test_with_a_simulated_user_the_agent_asks_for_the_order_number():
    env = ServiceDeskToolsEnv(user=CooperativeUser())
    instance = env.generate_instance(random.Random(3))
    opening = env.new_episode(instance).reset()
    item = instance.order(instance.order_id).item
    assert opening.messages == ({"role": "user", "content": f"{instance.request} my {item}"},)
    assert "ask_customer" in {schema["function"]["name"] for schema in opening.tool_schemas}
    turns = env.demonstration(instance)
    (ask, answers) = turns[0]
    assert [call.name for call in ask.calls] == ["ask_customer"]
    assert [answer.content for answer in answers] == [str(instance.order_id)]  # the customer gives the number
    assert turns[-1][0].calls[0].name == "reply"
    _, steps = play(env, instance, [[(call.name, call.arguments) for call in turn.calls] for turn, _ in turns])
    assert steps[-1].success
