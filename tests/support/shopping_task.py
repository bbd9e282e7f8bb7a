"""A conversational tool task for tests: a shopper asks for items one at a time, the agent puts each in
the basket with `add`, and the shopper's next request comes after the agent's turn without a call."""

from __future__ import annotations

import asyncio
import random
from typing import NamedTuple

from lit_asyncrl.envs.tools import Ending, Grade, ToolEnv
from lit_asyncrl.envs.users import ScriptedUser


class Shopper(NamedTuple):
    """The user's goal: the requests after the opening, said in order (`ScriptedUser` reads `script`)."""

    instructions: str
    script: tuple[str, ...]

    def answer(self, question: str) -> str:
        return self.script[0]


class Basket:
    def __init__(self, wanted: tuple[str, ...], slow_s: float) -> None:
        self.wanted = wanted
        self.items: list[str] = []
        self.slow_s = slow_s

    async def add(self, item: str) -> str:
        """Put an item in the basket.

        Args:
            item: The item's name.
        """
        await asyncio.sleep(self.slow_s)
        self.items.append(item)
        return f"{len(self.items)} in the basket"


class ShoppingTask(ToolEnv):
    """Instances are the items wanted, in order; the reward is the share of them in the basket.

    Two turns per item (the call, then a word to the shopper); every ending is kept in `endings`.
    """

    def __init__(self, grades_cut_offs: bool = True, slow_s: float = 0.0, user=None, **settings) -> None:
        super().__init__(user=ScriptedUser() if user is None else user, **settings)
        self.grades_cut_offs = grades_cut_offs
        self.slow_s = slow_s
        self.endings: list[Ending] = []

    def generate_instance(self, rng: random.Random) -> tuple[str, ...]:
        return ("mug", "hat")

    def new_state(self, instance: tuple[str, ...]) -> Basket:
        return Basket(instance, self.slow_s)

    def tools(self, state: Basket) -> list:
        return [state.add]

    def opening(self, instance: tuple[str, ...]) -> list[dict]:
        return [{"role": "user", "content": f"add a {instance[0]}"}]

    def user_goal(self, state: Basket) -> Shopper:
        return Shopper(
            "You want a " + " and a ".join(state.wanted), tuple(f"add a {item}" for item in state.wanted[1:])
        )

    def turn_limit(self, instance: tuple[str, ...]) -> int:
        return 2 * len(instance)

    def grade(self, ending: Ending) -> Grade:
        self.endings.append(ending)
        found = sum(item in ending.state.items for item in ending.instance)
        return Grade(found / len(ending.instance), found == len(ending.instance))


#: `add`'s schema as an agent program offers it in a chat request (`tools=`).
ADD_SCHEMA = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Put an item in the basket.",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
    },
}


def add(item: str) -> str:
    """A model turn calling `add`, in the Hermes format."""
    return f'<tool_call>{{"name": "add", "arguments": {{"item": "{item}"}}}}</tool_call>'
