"""A tool task whose tools come from an MCP server (`tests/integration/mcp_server.py`): add two numbers."""

from __future__ import annotations

import random
import sys
from typing import Any

from lit_asyncrl.envs.tools import AssistantTurn, Ending, Grade, ToolCall, ToolEnv, ToolMessage
from lit_asyncrl.envs.tools.mcp_tools import McpServerTools


class Sum:
    def __init__(self, a: int, b: int) -> None:
        self.a, self.b, self.answered = a, b, False


class McpAdditionTask(ToolEnv):
    """`add A B`: one call of the server's `add` with the two numbers is a solved episode."""

    max_turn_tokens = 64

    def __init__(self, count_file: str, **settings: Any) -> None:
        super().__init__(**{"max_turns": 1, **settings})
        self.server = McpServerTools(sys.executable, ["-m", "tests.integration.mcp_server", count_file])

    def generate_instance(self, rng: random.Random) -> tuple[int, int]:
        return rng.randint(1, 9), rng.randint(1, 9)

    def new_state(self, instance: tuple[int, int]) -> Sum:
        return Sum(*instance)

    def tools(self, state: Sum) -> list:
        return self.server.tools()

    def opening(self, instance: tuple[int, int]) -> list[dict]:
        return [{"role": "user", "content": f"add {instance[0]} {instance[1]}"}]

    def grade(self, ending: Ending) -> Grade:
        answers = [message["content"] for message in ending.transcript if message["role"] == "tool"]
        right = answers == [str(ending.state.a + ending.state.b)]
        return Grade(float(right), right)

    def start(self, make_engine=None) -> None:
        self.server.start()

    def close(self) -> None:
        self.server.close()

    def demonstration(self, instance: tuple[int, int]) -> list[tuple[AssistantTurn, list[ToolMessage]]]:
        # Written out rather than played: the warm start runs before the run starts the server.
        a, b = instance
        return [(AssistantTurn("", (ToolCall("add", {"a": a, "b": b}),)), [ToolMessage(str(a + b), "add")])]
