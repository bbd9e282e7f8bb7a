"""The user's side of a tool task: what the user says after an agent turn without a call.

A tool task may have a user (`ToolEnv(user=...)`, any `SimulatedUser`): an agent turn that calls no
tool is then a message to the user, who answers with a `user` message (the episode goes on) or with
None (the user ends the conversation). Without a user, such a turn ends the episode, as it always did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from lit_asyncrl.envs.tools.calls import ToolOpening
from lit_asyncrl.envs.users.simulated import Message


@dataclasses.dataclass(frozen=True)
class UserMessage:
    """The user's answer to an agent turn, rendered as a `user` message (never as a tool result)."""

    content: str

    def message(self) -> dict[str, Any]:
        return {"role": "user", "content": self.content}


def conversation_of(transcript: list[dict[str, Any]]) -> list[Message]:
    """The conversation as the user saw it: the user's messages and the agent's turns without calls
    (the agent's calls and the tools' answers are between the agent and its tools)."""
    conversation = []
    for message in transcript:
        if message["role"] == "user":
            conversation.append(Message("user", message["content"]))
        elif message["role"] == "assistant" and not message.get("tool_calls"):
            conversation.append(Message("agent", message["content"]))
    return conversation


class UserOpening:
    """A tool episode's opening that the user completes (the task's opening ends with the agent's greeting):
    awaiting it asks the user and gives the whole opening. `before_user` is the opening up to the user's
    first words: what can be measured before any engine (a user played by a model) has started."""

    def __init__(self, before_user: ToolOpening, complete: Callable[[ToolOpening], Awaitable[ToolOpening]]) -> None:
        self.before_user = before_user
        self._complete = complete

    def __await__(self) -> Generator[Any, None, ToolOpening]:
        return self._complete(self.before_user).__await__()
