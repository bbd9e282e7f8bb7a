"""Tool calls as the episode sees them: what the model's turn asked for, and what each call answered."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

#: Why a call got an error answer instead of a result (`rollout/tool_call_errors/<reason>`).
UNPARSABLE = "unparsable"  # the turn opened a call the model's tool parser could not read (bad JSON)
UNKNOWN_TOOL = "unknown_tool"
INVALID_ARGUMENTS = "invalid_arguments"  # not an object, or not matching the tool's schema
TOOL_ERROR = "tool_error"  # the tool raised
TIMEOUT = "timeout"  # the tool ran past the task's `tool_timeout_s`
ERROR_REASONS = (UNPARSABLE, UNKNOWN_TOOL, INVALID_ARGUMENTS, TOOL_ERROR, TIMEOUT)


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments (a dict when the model wrote a JSON object)."""

    name: str
    arguments: Any
    call_id: str | None = None

    def as_message_call(self) -> dict[str, Any]:
        """The call as an assistant message's `tool_calls` entry (what chat templates render)."""
        call = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if self.call_id is None else {**call, "id": self.call_id}

    def compact_json(self) -> str:
        """`{"name":...,"arguments":...}` without whitespace (the compact rendering)."""
        return json.dumps({"name": self.name, "arguments": self.arguments}, separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class AssistantTurn:
    """A model turn read by the model's tool parser: its text outside the calls, and the calls in
    order. `unparsable` is set when the turn opened a call that could not be read."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    unparsable: bool = False

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            message["tool_calls"] = [call.as_message_call() for call in self.calls]
        return message


@dataclasses.dataclass(frozen=True)
class ToolMessage:
    """A call's answer, rendered as a `tool` message: the result, or an error the model can read."""

    content: str
    name: str | None = None
    call_id: str | None = None
    error: str | None = None  # the reason (one of ERROR_REASONS) when the call failed
    #: The arguments a lenient check took from a string as the number the schema asks for (`arguments.py`).
    coerced: tuple[str, ...] = ()

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "tool", "content": self.content}
        if self.name is not None:
            message["name"] = self.name
        if self.call_id is not None:
            message["tool_call_id"] = self.call_id
        return message


@dataclasses.dataclass(frozen=True)
class ToolOpening:
    """What a tool episode opens with: its first messages and the schemas of the tools it offers."""

    messages: tuple[dict[str, Any], ...]
    tool_schemas: tuple[dict[str, Any], ...]
