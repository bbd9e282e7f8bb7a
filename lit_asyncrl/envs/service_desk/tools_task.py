"""The service desk with JSON tools: the same customers, orders, rules and reward as `service_desk.py`,
with the agent calling tools the way chat models do (`envs/tools`).

Tools: `look(order_id)` shows an order's record (`42 mug delivered 12d`), `refund(order_id)` and
`cancel(order_id)` change it (`ok`), `reply(message)` answers the customer with one word and ends the
episode, and with a simulated user, `ask_customer(question)` relays a question to the customer. An
unknown order makes the tool raise: the agent reads the error and the call counts as failed. The
reward is 1 when the final statuses and the reply both match the desk's policy (`decide`), plus
`call_error_reward` for each failed call; the rules are never stated, as in the text desk.
"""

from __future__ import annotations

import random
from typing import Any

from lit_asyncrl.envs.service_desk.episode import one_line
from lit_asyncrl.envs.service_desk.orders import WRITE_TOOLS, CustomerGoal, DeskInstance, decide
from lit_asyncrl.envs.service_desk.task import ServiceDeskEnv
from lit_asyncrl.envs.tools import Ending, Grade, ToolCall, ToolEnv
from lit_asyncrl.envs.users.simulated import Message, SimulatedUser


class DeskState:
    """One episode's copy of the order statuses, the customer, and the reply once sent; its methods are the tools."""

    def __init__(self, instance: DeskInstance, user: SimulatedUser | None) -> None:
        self.instance = instance
        self.user = user
        self.statuses = {order.order_id: order.status for order in instance.orders}
        self.reply_word: str | None = None
        self.goal = CustomerGoal(instance.request, instance.order(instance.order_id).item, instance.order_id)
        self.conversation: list[Message] = []

    def look(self, order_id: int) -> str:
        """Show an order's record: its id, item, status, and days since delivery (since the order when not delivered).

        Args:
            order_id: The order's number.
        """
        return self.instance.order(self._known(order_id)).record(self.statuses[order_id]).rstrip("\n")

    def refund(self, order_id: int) -> str:
        """Refund an order.

        Args:
            order_id: The order's number.
        """
        self.statuses[self._known(order_id)] = WRITE_TOOLS["refund"]
        return "ok"

    def cancel(self, order_id: int) -> str:
        """Cancel an order.

        Args:
            order_id: The order's number.
        """
        self.statuses[self._known(order_id)] = WRITE_TOOLS["cancel"]
        return "ok"

    def reply(self, message: str) -> str:
        """Answer the customer with one word and end the conversation.

        Args:
            message: The answer (choices: ["done", "no", "placed", "shipped", "delivered", "cancelled", "refunded"])
        """
        self.reply_word = message
        return "sent"

    async def ask_customer(self, question: str) -> str:
        """Ask the customer a question and get their answer.

        Args:
            question: The question, e.g. for the order's number.
        """
        self.conversation.append(Message("agent", question))
        answer = one_line(await self.user.reply(self.goal, list(self.conversation)))
        self.conversation.append(Message("user", answer))
        return answer

    def _known(self, order_id: int) -> int:
        if order_id not in self.statuses:
            raise ValueError(f"no order {order_id}")
        return order_id


class ServiceDeskToolsEnv(ToolEnv):
    """The service desk in JSON tools; `demonstration_calls` plays the desk's policy.

    Args:
        difficulty, refund_window_days, held_out_fraction, user: as for `ServiceDeskEnv`.
        tool_parser, tool_timeout_s, call_error_reward, max_turns, arguments, latency_s, episode_timeout_s:
            see `ToolEnv`.
    """

    system_prompt = (
        "You are a service desk agent. Use the tools to look up the customer's order and act on their request, "
        "then reply."
    )
    #: The longest call in the compact rendering, `reply` with `cancelled` (71 characters), and its stop.
    max_turn_tokens = 80

    def __init__(
        self,
        difficulty: str = "easy",
        refund_window_days: int = 30,
        call_error_reward: float = -0.1,
        max_turns: int = 4,
        held_out_fraction: float = 0.2,
        user: SimulatedUser | None = None,
        tool_parser: str = "hermes",
        tool_timeout_s: float = 10.0,
        arguments: str = "strict",
        latency_s: float = 0.0,
        episode_timeout_s: float | None = None,
    ) -> None:
        super().__init__(
            tool_parser=tool_parser,
            tool_timeout_s=tool_timeout_s,
            call_error_reward=call_error_reward,
            max_turns=max_turns,
            arguments=arguments,
            latency_s=latency_s,
            episode_timeout_s=episode_timeout_s,
        )
        # The text desk draws the instances and checks the shared settings.
        self.desk = ServiceDeskEnv(
            difficulty, refund_window_days, call_error_reward, max_turns, held_out_fraction, user
        )
        self.refund_window_days = refund_window_days
        self.held_out_fraction = held_out_fraction
        # Reached through the ask_customer tool only: a turn without a call still ends the episode
        # (the task's reward as before), so the customer is not the base class's conversational `user`.
        self.customer = user

    def generate_instance(self, rng: random.Random) -> DeskInstance:
        return self.desk.generate_instance(rng)

    def instance_key(self, instance: DeskInstance) -> str:
        return self.desk.instance_key(instance)

    def new_state(self, instance: DeskInstance) -> DeskState:
        return DeskState(instance, self.customer)

    def tools(self, state: DeskState) -> list[Any]:
        return [
            state.look,
            state.refund,
            state.cancel,
            state.reply,
            *([state.ask_customer] if self.customer is not None else []),
        ]

    def opening(self, instance: DeskInstance) -> list[dict[str, Any]]:
        if self.customer is not None:  # the customer names the item; the order's number is theirs to give
            return [{"role": "user", "content": f"{instance.request} my {instance.order(instance.order_id).item}"}]
        return [{"role": "user", "content": f"{instance.request} order {instance.order_id}"}]

    def finished(self, state: DeskState) -> bool:
        return state.reply_word is not None

    def grade(self, ending: Ending) -> Grade:
        state = ending.state
        requested = state.instance.order(state.instance.order_id)
        write, goal_reply = decide(state.instance.request, requested.status, requested.days, self.refund_window_days)
        goal_statuses = {order.order_id: order.status for order in state.instance.orders}
        if write is not None:
            goal_statuses[requested.order_id] = WRITE_TOOLS[write]
        success = state.reply_word == goal_reply and state.statuses == goal_statuses
        return Grade(float(success), success)

    def start(self, make_engine=None) -> None:
        self.desk.start(make_engine)

    def close(self) -> None:
        self.desk.close()

    def demonstration_calls(self, instance: DeskInstance) -> list[list[ToolCall]]:
        requested = instance.order(instance.order_id)
        write, reply = decide(instance.request, requested.status, requested.days, self.refund_window_days)
        asked = (
            [[ToolCall("ask_customer", {"question": "What is the order number?"})]] if self.customer is not None else []
        )
        acted = [[ToolCall(write, {"order_id": instance.order_id})]] if write is not None else []
        return [
            *asked,
            [ToolCall("look", {"order_id": instance.order_id})],
            *acted,
            [ToolCall("reply", {"message": reply})],
        ]
