"""One service-desk episode: the tools over the episode's copy of the database, and with a simulated
user, the conversation (`ask`)."""

from __future__ import annotations

import re
import string

from lit_asyncrl.envs.base import Transition
from lit_asyncrl.envs.service_desk.orders import REPLY_WORDS, WRITE_TOOLS, CustomerGoal, DeskInstance, decide
from lit_asyncrl.envs.users.simulated import Message, SimulatedUser

ERROR = "err\n"
_CALL = re.compile(r"(look|refund|cancel) ([1-9][0-9]*)\n|reply ([a-z]+)\n")
_ASK = re.compile(r"ask ([^\n]+)\n")
#: The longest user answer the desk passes on (a language model may ramble); the rest is cut.
MAX_USER_ANSWER_CHARS = 80


class ServiceDeskEpisode:
    """One conversation; it owns its copy of the database's statuses (the only mutable part)."""

    def __init__(
        self, instance: DeskInstance, refund_window_days: int, max_turns: int, malformed_reward: float
    ) -> None:
        self.instance = instance
        self.max_turns = max_turns
        self.malformed_reward = malformed_reward
        self.statuses = {order.order_id: order.status for order in instance.orders}
        self.turns = 0
        requested = instance.order(instance.order_id)
        write, self.goal_reply = decide(instance.request, requested.status, requested.days, refund_window_days)
        self.goal_statuses = dict(self.statuses)
        if write is not None:
            self.goal_statuses[instance.order_id] = WRITE_TOOLS[write]

    def reset(self, seed: int | None = None) -> str:
        return f"user: {self.instance.request} {self.instance.order_id}\n"

    def step(self, action: str) -> Transition:
        self.turns += 1
        call = _CALL.fullmatch(action)
        if call is None:
            return self._continue(ERROR, self.malformed_reward, {"malformed": True})
        tool = call.group(1)
        order_id = call.group(2)
        word = call.group(3)
        if word is not None:
            if word not in REPLY_WORDS:
                return self._continue(ERROR, self.malformed_reward, {"malformed": True})
            success = word == self.goal_reply and self.statuses == self.goal_statuses
            return Transition("", float(success), terminated=True, truncated=False, info={"success": success})
        order_id = int(order_id)
        if order_id not in self.statuses:
            return self._continue(ERROR, self.malformed_reward, {"malformed": True})
        if tool == "look":
            return self._continue(self.instance.order(order_id).record(self.statuses[order_id]), 0.0)
        self.statuses[order_id] = WRITE_TOOLS[tool]
        return self._continue("ok\n", 0.0)

    def _continue(self, observation: str, reward: float, info: dict | None = None) -> Transition:
        # Out of turns without a reply: cut short, and never a success.
        return Transition(
            observation, reward, terminated=False, truncated=self.turns >= self.max_turns, info=info or {}
        )


class DeskConversation(ServiceDeskEpisode):
    """A desk episode with a simulated user: the request names the item, and `ask` talks to the user.

    `step` is a coroutine (the user may be a model on another engine); the tools answer as in
    `ServiceDeskEpisode`. The user's answer comes back as one line, `user: <answer>`, cut to
    `MAX_USER_ANSWER_CHARS` printable ASCII characters (what every policy's tokenizer encodes).
    """

    def __init__(
        self,
        instance: DeskInstance,
        user: SimulatedUser,
        refund_window_days: int,
        max_turns: int,
        malformed_reward: float,
    ) -> None:
        super().__init__(instance, refund_window_days, max_turns, malformed_reward)
        self.user = user
        self.goal = CustomerGoal(instance.request, instance.order(instance.order_id).item, instance.order_id)
        self.conversation: list[Message] = []

    def reset(self, seed: int | None = None) -> str:
        opening = f"{self.goal.request} {self.goal.item}"
        self.conversation = [Message("user", opening)]
        return f"user: {opening}\n"

    async def step(self, action: str) -> Transition:
        question = _ASK.fullmatch(action)
        if question is None:
            return super().step(action)
        self.turns += 1
        self.conversation.append(Message("agent", question.group(1)))
        answer = one_line(await self.user.reply(self.goal, list(self.conversation)))
        self.conversation.append(Message("user", answer))
        return self._continue(f"user: {answer}\n", 0.0)


def one_line(text: str) -> str:
    """`text` as the desk relays a user's answer: its first line, printable ASCII only, at most
    `MAX_USER_ANSWER_CHARS`."""
    printable = "".join(char if char in string.printable and char not in "\t\r\x0b\x0c" else " " for char in text)
    line = printable.strip().split("\n", 1)[0].strip()
    return line[:MAX_USER_ANSWER_CHARS] or "..."
