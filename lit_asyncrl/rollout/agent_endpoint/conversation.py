"""One agent episode's chat calls as trajectories of exact token ids, spliced where they continue.

An agent program sends every call with its whole conversation (`messages`, `tools`). Rendering each
call's conversation again would re-tokenize text the model sampled, and the trainer would score ids the
engine never produced. Instead, a call whose messages are the episode's conversation so far (its opening,
each answer this endpoint returned, the tools' and user's messages after them) followed by new tool
results or one new user message continues the same trajectory: only the new messages are rendered and
appended (the episode format's `add_observation`), so the sampled ids stay exactly the engine's. Any other
call (a truncated or summarised history, an edited turn, other tools) opens a new segment, rendered from
its messages; each segment is exact on its own and their number is what `rollout/episode_segments` counts.
"""

from __future__ import annotations

import json
from typing import Any

from lit_asyncrl.envs.tools import AssistantTurn, ToolMessage, ToolOpening, UserMessage
from lit_asyncrl.rollout.engine.protocol import TurnOutput
from lit_asyncrl.rollout.episodes.tool_calls import ChatToolFormat
from lit_asyncrl.rollout.records import Trajectory


class AgentConversation:
    """The trajectories of one agent episode's calls (see the module's docstring).

    Args:
        episode_format: the policy's chat rendering with its tool parser (`ChatToolFormat`).
        group_id: the group the episode's trajectories belong to.
    """

    def __init__(self, episode_format: ChatToolFormat, group_id: int) -> None:
        self.episode_format = episode_format
        self.group_id = group_id
        self.segments: list[Trajectory] = []
        #: Why the episode cannot be trained on (e.g. its agent disconnected during a call), None while it can.
        self.dropped: str | None = None
        self._conversation: list[Any] = []  # the current segment's messages, compared as `_comparable`
        self._tools: list[dict[str, Any]] | None = None

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The ids to sample the call's answer after: the current segment continued, or a new one."""
        comparable = [_comparable(message) for message in messages]
        known = len(self._conversation)
        continued = (
            self.segments
            and tools == self._tools
            and comparable[:known] == self._conversation
            and _answers(messages[known:]) is not None
        )
        if continued:
            self.episode_format.add_observation(self.segments[-1], _answers(messages[known:]))
        else:
            segment = Trajectory(group_id=self.group_id)
            opening = ToolOpening(tuple(_renderable(message) for message in messages), tuple(tools or ()))
            self.episode_format.open(segment, opening)
            self.segments.append(segment)
        self._conversation = comparable
        self._tools = tools
        return list(self.segments[-1].token_ids)

    def record(self, turn: TurnOutput) -> AssistantTurn:
        """Append a sampled answer to the current segment as sampled; the answer as the agent reads it."""
        segment = self.segments[-1]
        segment.extend_policy(turn.token_ids, turn.logprobs, turn.versions)
        segment.num_turns += 1
        answer = self.episode_format.action(turn.token_ids)
        self._conversation.append(_comparable(answer.message()))
        return answer


def _answers(messages: list[dict[str, Any]]) -> list[ToolMessage | UserMessage] | None:
    """New messages after an answer, as the episode format appends them: the tools' results, or one user
    message; None for anything else (which then opens a new segment)."""
    if not messages:
        return None
    if all(message.get("role") == "tool" for message in messages):
        return [ToolMessage(_text(message), message.get("name"), message.get("tool_call_id")) for message in messages]
    if len(messages) == 1 and messages[0].get("role") == "user":
        return [UserMessage(_text(messages[0]))]
    return None


def _renderable(message: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates take it: text for a missing content, call arguments as objects (OpenAI's
    wire format sends them as JSON text)."""
    rendered = {**message, "content": _text(message)}
    if message.get("tool_calls"):
        rendered["tool_calls"] = [
            {
                **call,
                "function": {**call["function"], "arguments": _parsed(call["function"]["arguments"])},
            }
            for call in message["tool_calls"]
        ]
    return rendered


def _comparable(message: dict[str, Any]) -> tuple:
    """A message as far as its rendering goes: its role, its text and its calls (name and arguments,
    JSON text or objects alike), without the ids a client may drop or keep."""
    calls = tuple(
        (call["function"]["name"], json.dumps(_parsed(call["function"]["arguments"]), sort_keys=True))
        for call in message.get("tool_calls") or ()
    )
    return message["role"], _text(message), calls


def _parsed(arguments: Any) -> Any:
    """Call arguments as an object: OpenAI's wire format sends JSON text (kept as text when it is not JSON)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return "" if content is None else content
