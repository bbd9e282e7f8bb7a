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
from lit_asyncrl.rollout.engine.protocol import Engine, TurnOutput
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.episodes.tool_calls import ChatToolFormat, CompactToolFormat
from lit_asyncrl.rollout.records import Trajectory


class AgentConversation:
    """The trajectories of one agent episode's calls (see the module's docstring).

    Every method runs on the engine's event loop, where the producer and the old-logit routes read the
    same trajectories.

    Args:
        episode_format: the policy's rendering with its tool parser (`ChatToolFormat`, or
            `CompactToolFormat` for a plain-text policy).
        trajectory: the episode's first segment (the producer's trajectory); later segments go to its
            `later_segments`.
    """

    def __init__(self, episode_format: ChatToolFormat | CompactToolFormat, trajectory: Trajectory) -> None:
        self.episode_format = episode_format
        self.trajectory = trajectory
        #: Why the episode cannot be trained on (e.g. its agent disconnected during a call), None while it can.
        self.dropped: str | None = None
        self._opened = False
        self._conversation: list[Any] = []  # the current segment's messages, compared as `_comparable`
        self._tools: list[dict[str, Any]] | None = None

    @property
    def segments(self) -> list[Trajectory]:
        """The episode's segments so far (none before its first call)."""
        return self.trajectory.segments if self._opened else []

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """The ids to sample the call's answer after: the current segment continued, or a new one."""
        comparable = [_comparable(message) for message in messages]
        known = len(self._conversation)
        answers = _answers(messages[known:])
        continued = (
            self._opened and tools == self._tools and comparable[:known] == self._conversation and answers is not None
        )
        if continued:
            self.episode_format.add_observation(self.segments[-1], answers)
        else:
            segment = self.trajectory if not self._opened else Trajectory(group_id=self.trajectory.group_id)
            opening = ToolOpening(tuple(_renderable(message) for message in messages), tuple(tools or ()))
            self.episode_format.open(segment, opening)
            if self._opened:
                self.trajectory.later_segments.append(segment)
            self._opened = True
        segment = self.segments[-1]
        segment.committed = len(segment.token_ids)
        self._conversation = comparable
        self._tools = tools
        return list(segment.token_ids)

    async def sample(
        self, engine: Engine, sampling: SamplingSettings, max_tokens: int, stop_token_ids: list[int]
    ) -> TurnOutput:
        """Sample the answer to the current segment, streamed into it as the engine gives it (so the
        old-logit routes can score a call in flight), with the engine's final versions."""
        segment = self.segments[-1]
        turn_start = len(segment.token_ids)
        segment.turn_starts.append(turn_start)
        turn = await engine.generate(
            list(segment.token_ids),
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            stop_token_ids=stop_token_ids,
            # Provisional versions; the engine's final spans below are authoritative.
            on_tokens=lambda ids, logprobs: segment.extend_policy(ids, logprobs, [engine.version] * len(ids)),
        )
        segment.misattributed_scores += segment.set_versions(turn_start, turn.versions)
        segment.num_turns += 1
        segment.committed = len(segment.token_ids)
        return turn

    def answer(self, turn: TurnOutput, request_stop_ids: list[int]) -> AssistantTurn:
        """The sampled answer as the agent reads it (a stop token the request asked for left out, as
        OpenAI leaves out a stop sequence); it is part of the conversation from here on."""
        ids = turn.token_ids
        if ids and ids[-1] in request_stop_ids:
            ids = ids[:-1]
        answer = self.episode_format.action(ids)
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
