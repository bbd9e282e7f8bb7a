"""The model's side of a tool task: its calls read by vLLM's tool parser, the tools' answers rendered
for it, as chat messages (`ChatToolFormat`) or as compact raw text (`CompactToolFormat`).

Both keep the episode formats' guarantee: each new piece is tokenized on its own and appended, so
the ids the trainer scores are exactly the ids the engine saw.

Chat models. The opening is rendered once per episode with the tools' schemas: through the chat
template's `tools=` where the template renders them (Qwen2.5/Qwen3, Llama 3.x, Hermes), otherwise
(e.g. SmolLM2) appended to the system message in the Hermes format (`hermes_tools_prompt`), with
each turn's answers then sent back as one user message of `<tool_response>` blocks. The task's user,
when it answers a turn without a call, speaks in a user message of its own in both (never inside
`<tool_response>`). A demonstrated turn is the template's own rendering of the calls (the Hermes
format in the fallback), checked to parse back to the same calls.

Plain-text policies (the built-in tiny one: a character vocabulary and 1,024 positions). No schemas
(such a policy learns its tools from demonstrations), the opening's messages and each answer (a
tool's or the user's) as a line of their own, and calls in the Hermes format without whitespace,
ended by the task's stop text: `<tool_call>{"name":"look","arguments":{"order_id":42}}</tool_call>` then a
newline. vLLM's `hermes` parser reads them, so this rendering needs `tool_parser=hermes`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from lit_asyncrl.envs.agent_program import AgentTask
from lit_asyncrl.envs.tools import AssistantTurn, ToolCall, ToolEnv, ToolMessage, ToolOpening, UserMessage
from lit_asyncrl.rollout.episodes.formats import ChatTemplateFormat, PlainFormat
from lit_asyncrl.rollout.records import Trajectory

#: Stand-in content of the assistant turn that tool messages are rendered after.
_ASSISTANT = "\x1flit-asyncrl-assistant\x1f"
#: A schema only used to ask a chat template whether it renders tools.
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "lit_asyncrl_probe",
        "description": "probe",
        "parameters": {"type": "object", "properties": {}},
    },
}


class ToolCallParser:
    """vLLM's tool parser `name` for the model's chat format, reading one finished turn at a time."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        from vllm.tool_parsers import ToolParserManager

        try:
            parser_class = ToolParserManager.get_tool_parser(name)
        except KeyError:
            known = ", ".join(sorted(ToolParserManager.list_registered()))
            raise ValueError(f"env.tool_parser={name!r} is not one of vLLM's tool parsers ({known})") from None
        self.name = name
        self.tokenizer = tokenizer
        self.parser = parser_class(tokenizer)
        self.parser_logger = logging.getLogger(parser_class.__module__)
        self.call_opening = getattr(self.parser, "tool_call_start_token", None)

    def parse_turn(self, turn_ids: list[int], stop_token_ids: list[int]) -> AssistantTurn:
        """A sampled turn, its stop tokens left out. Special tokens stay: some models' call markers
        are special tokens (as vLLM's parsers expect)."""
        return self.parse(
            self.tokenizer.decode([i for i in turn_ids if i not in stop_token_ids], skip_special_tokens=False)
        )

    def parse(self, text: str) -> AssistantTurn:
        # A turn the parser cannot read is answered and counted here (`unparsable`); the parser
        # would also log it with a traceback, once per bad turn, over the progress bar. (Its level
        # cannot be set once: vLLM's logging set-up, run again when an engine starts, resets it.)
        was_disabled = self.parser_logger.disabled
        self.parser_logger.disabled = True
        try:
            extracted = self.parser.extract_tool_calls(text, request=None)
        finally:
            self.parser_logger.disabled = was_disabled
        if not extracted.tools_called:
            # Parsers read a turn whole: a turn that opened a call and yields none held a bad one.
            return AssistantTurn(text, (), unparsable=self.call_opening is not None and self.call_opening in text)
        calls = tuple(
            ToolCall(call.function.name, _arguments(call.function.arguments), call.id) for call in extracted.tool_calls
        )
        return AssistantTurn(extracted.content or "", calls)


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text  # not JSON: the episode answers it as invalid arguments


def hermes_tools_prompt(schemas: list[dict[str, Any]]) -> str:
    """The tools' schemas for a system message, in the Hermes format (for templates without `tools=`)."""
    listed = "\n".join(json.dumps(schema) for schema in schemas)
    return (
        "You can call these tools, given as JSON schemas:\n"
        f"<tools>\n{listed}\n</tools>\n"
        'To call a tool, write <tool_call>\n{"name": "<tool name>", "arguments": {<arguments as JSON>}}\n</tool_call>; '
        "write one such block per call. The results come back in <tool_response></tool_response> blocks."
    )


def hermes_calls(turn: AssistantTurn) -> str:
    """A turn's text and calls in the Hermes format (the fallback's demonstrations)."""
    blocks = [
        f"<tool_call>\n{json.dumps({'name': call.name, 'arguments': call.arguments})}\n</tool_call>"
        for call in turn.calls
    ]
    return "\n".join([turn.content, *blocks] if turn.content else blocks)


class ChatToolFormat(ChatTemplateFormat):
    """Tool calls through the model's chat template (see the module's docstring)."""

    opening_types = (ToolOpening, list)
    observation_types = (ToolOpening, list)

    def __init__(self, tokenizer: Any, env: ToolEnv | AgentTask) -> None:
        super().__init__(tokenizer, env)
        self.parser = ToolCallParser(env.tool_parser, tokenizer)
        self.system_prompt = env.system_prompt
        hello = [{"role": "user", "content": "hello"}]
        self.template_renders_tools = self._render(hello, True) != self._render_with_tools(hello, [_PROBE_TOOL], True)
        self._earlier = [*hello, {"role": "assistant", "content": _ASSISTANT}]
        self._earlier_rendered = self._render(self._earlier, False)

    def _render_with_tools(self, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )

    def open(self, trajectory: Trajectory, opening: ToolOpening) -> None:
        messages = list(opening.messages)
        schemas = list(opening.tool_schemas)
        system = [message["content"] for message in messages[:1] if message["role"] == "system"]
        rest = messages[len(system) :]
        if self.template_renders_tools:
            head = (
                [{"role": "system", "content": "\n\n".join([self.system_prompt or "", *system]).strip()}]
                if self.system_prompt or system
                else []
            )
            text = self._render_with_tools([*head, *rest], schemas or None, True)
        else:
            parts = [self.system_prompt, *system, hermes_tools_prompt(schemas) if schemas else None]
            content = "\n\n".join(part for part in parts if part)
            text = self._render(([{"role": "system", "content": content}] if content else []) + rest, True)
        trajectory.extend_context(self._encode(text, "reset"))

    def add_observation(self, trajectory: Trajectory, answers: list[ToolMessage | UserMessage]) -> None:
        if self.template_renders_tools:
            extended = self._render([*self._earlier, *(answer.message() for answer in answers)], True)
            if not extended.startswith(self._earlier_rendered):
                raise ValueError(
                    "the chat template re-renders earlier messages when tool messages are added: "
                    "it cannot be tokenized incrementally"
                )
            text = self._after_end_of_turn + extended[len(self._earlier_rendered) :]
        else:
            text = self._after_end_of_turn + self._hermes_message(answers)
        closed = trajectory.token_ids and trajectory.token_ids[-1] == self.end_of_turn_id
        ids = self._encode(text, "step")
        trajectory.extend_context(ids if closed else [self.end_of_turn_id, *ids])

    def _hermes_message(self, answers: list[ToolMessage | UserMessage]) -> str:
        """The fallback's user message after a turn: the user's answer as written, or the turn's tool
        answers as `<tool_response>` blocks (an episode answers a turn with one or the other)."""
        before, after = self._answers["user"][1]
        if len(answers) == 1 and isinstance(answers[0], UserMessage):
            return before + answers[0].content + after
        return before + "\n".join(f"<tool_response>\n{answer.content}\n</tool_response>" for answer in answers) + after

    def action(self, turn_ids: list[int]) -> AssistantTurn:
        return self.parser.parse_turn(turn_ids, self.stop_token_ids)

    def demonstrated_turn_ids(self, turn: AssistantTurn) -> list[int]:
        if self.template_renders_tools:
            hello = self._earlier[:1]
            prompt = self._render(hello, True)
            rendered = self._render([*hello, turn.message()], False)
            closing = self._after_end_of_turn_closing()
            if not rendered.startswith(prompt) or not rendered.endswith(closing):
                raise ValueError(
                    "the chat template renders an assistant turn with tool calls in a way that cannot be cut out "
                    "of the conversation"
                )
            text = rendered[len(prompt) : len(rendered) - len(closing)]
        else:
            text = hermes_calls(turn)
        parsed = self.parser.parse(text)
        if [(call.name, call.arguments) for call in parsed.calls] != [
            (call.name, call.arguments) for call in turn.calls
        ]:
            raise ValueError(
                f"env.tool_parser={self.parser.name!r} does not read back the demonstrated calls rendered as {text!r}"
            )
        return [*self._encode(text, "demonstration"), self.end_of_turn_id]

    def _after_end_of_turn_closing(self) -> str:
        end_of_turn = self.tokenizer.convert_ids_to_tokens(self.end_of_turn_id)
        return end_of_turn + self._after_end_of_turn


class CompactToolFormat(PlainFormat):
    """Tool calls for plain-text policies (see the module's docstring)."""

    opening_types = (ToolOpening, list)
    observation_types = (ToolOpening, list)

    def __init__(self, tokenizer: Any, env: ToolEnv | AgentTask) -> None:
        super().__init__(tokenizer, env)
        if env.tool_parser != "hermes":
            raise ValueError(
                f"env.tool_parser={env.tool_parser!r}: a policy without a chat template writes its calls in the "
                "compact Hermes rendering, which only the hermes parser reads; set it to hermes"
            )
        self.parser = ToolCallParser(env.tool_parser, tokenizer)

    def open(self, trajectory: Trajectory, opening: ToolOpening) -> None:
        lines = "".join(f"{message['content']}\n" for message in opening.messages if message["role"] != "system")
        trajectory.extend_context([self.tokenizer.bos_token_id, *self._encode(lines, "reset")])

    def add_observation(self, trajectory: Trajectory, answers: list[ToolMessage | UserMessage]) -> None:
        trajectory.extend_context(self._encode("".join(f"{answer.content}\n" for answer in answers), "step"))

    def action(self, turn_ids: list[int]) -> AssistantTurn:
        return self.parser.parse_turn(turn_ids, self.stop_token_ids)

    def demonstrated_turn_ids(self, turn: AssistantTurn) -> list[int]:
        calls = "".join(f"<tool_call>{call.compact_json()}</tool_call>" for call in turn.calls)
        return self._encode(turn.content + calls + self.turn_stop, "demonstration")
