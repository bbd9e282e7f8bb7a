"""How an episode becomes tokens: raw text for the tiny policy, the chat template for chat models.

Both formats build the token list turn by turn and never re-tokenize what is already there: the
engine is always sent the trajectory's own ids, so the ids the trainer scores are exactly the ids
the engine saw. A format only decides which tokens go around the environment's text and where an
agent turn stops.
"""

from __future__ import annotations

import abc
from typing import Any

from lit_asyncrl.envs.base import Environment
from lit_asyncrl.rollout.records import Trajectory
from lit_asyncrl.text import encode_text

#: Stand-ins rendered through the chat template to find the text around a message's content.
_CONTENT = "\x1flit-asyncrl-content\x1f"
_ASSISTANT = "\x1flit-asyncrl-assistant\x1f"


class EpisodeFormat(abc.ABC):
    """Tokens around the environment's text, and the tokens that end an agent turn."""

    def __init__(self, tokenizer: Any, env: Environment) -> None:
        self.tokenizer = tokenizer
        self.env_name = type(env).__name__
        self.turn_stop = env.turn_stop

    #: Token ids at which the engine ends an agent turn.
    stop_token_ids: list[int]

    #: What the environment's `reset` may answer, and its `step` (the runner refuses anything else).
    opening_types: tuple[type, ...] = (str,)
    observation_types: tuple[type, ...] = (str,)

    @abc.abstractmethod
    def open(self, trajectory: Trajectory, first_observation: str) -> None:
        """Append the episode's opening (the first observation and what precedes the first turn)."""

    @abc.abstractmethod
    def add_observation(self, trajectory: Trajectory, observation: str) -> None:
        """Append an environment answer after an agent turn, up to where the next turn starts."""

    @abc.abstractmethod
    def action(self, turn_ids: list[int]) -> str:
        """What the environment's `step` receives for an agent turn: its text, ending with `env.turn_stop`."""

    @abc.abstractmethod
    def demonstrated_turn_ids(self, action: str) -> list[int]:
        """The policy tokens of a scripted action (`action` ends with `env.turn_stop`)."""

    def _encode(self, text: str, source: str) -> list[int]:
        return encode_text(self.tokenizer, text, f"{self.env_name}.{source}")


class PlainFormat(EpisodeFormat):
    """BOS, then the environment's text and the agent's turns concatenated as they are.

    A turn ends at the environment's `turn_stop` token (or EOS); the built-in tiny policy and any
    tokenizer without a chat template use this format.
    """

    def __init__(self, tokenizer: Any, env: Environment) -> None:
        super().__init__(tokenizer, env)
        ids = tokenizer.encode(env.turn_stop, add_special_tokens=False)
        if len(ids) != 1 or ids[0] == getattr(tokenizer, "unk_token_id", None):
            raise ValueError(
                f"env.turn_stop={env.turn_stop!r} must be a single token of the policy's tokenizer, got ids {ids}"
            )
        self.stop_token_ids = [ids[0], tokenizer.eos_token_id]

    def open(self, trajectory: Trajectory, first_observation: str) -> None:
        trajectory.extend_context([self.tokenizer.bos_token_id, *self._encode(first_observation, "reset")])

    def add_observation(self, trajectory: Trajectory, observation: str) -> None:
        trajectory.extend_context(self._encode(observation, "step"))

    def action(self, turn_ids: list[int]) -> str:
        return self.tokenizer.decode(turn_ids, skip_special_tokens=False)

    def demonstrated_turn_ids(self, action: str) -> list[int]:
        return self._encode(action, "demonstration")


class ChatTemplateFormat(EpisodeFormat):
    """The tokenizer's chat template: system, user, assistant and tool messages.

    The first observation is a user message (after `env.system_prompt`, if the environment has
    one); later answers are messages of `env.observation_role_of(answer)` (by default
    `env.observation_role`: "user", or "tool" where the template renders a tool role). An agent turn
    ends at the template's end-of-turn token (`<|im_end|>` for ChatML), not at the task's own stop
    text; the environment still receives its action ending with `env.turn_stop`, so its parser is
    the same in both formats. A turn cut short (token limit) is closed with the end-of-turn token as
    context before the next message.

    The text around each message is found once by rendering stand-in messages, and each new
    message is tokenized on its own and appended, which is exact for templates that render a
    conversation as the concatenation of its messages (checked here; others are refused).
    """

    def __init__(self, tokenizer: Any, env: Environment) -> None:
        super().__init__(tokenizer, env)
        head = [{"role": "system", "content": env.system_prompt}] if getattr(env, "system_prompt", None) else []
        self._opening = _split(
            self._render([*head, {"role": "user", "content": _CONTENT}], True), _CONTENT, "the first user message"
        )
        earlier = [*head, {"role": "user", "content": "hello"}, {"role": "assistant", "content": _ASSISTANT}]
        rendered = self._render(earlier, False)
        closing = rendered[rendered.rindex(_ASSISTANT) + len(_ASSISTANT) :]
        closing_ids = tokenizer.encode(closing, add_special_tokens=False)
        if not closing_ids or closing_ids[0] not in tokenizer.all_special_ids:
            raise ValueError(
                f"the chat template closes an assistant message with {closing!r}: "
                "no end-of-turn special token found there"
            )
        self.end_of_turn_id = closing_ids[0]
        end_of_turn_text = tokenizer.convert_ids_to_tokens(self.end_of_turn_id)
        if not closing.startswith(end_of_turn_text):
            raise ValueError(
                f"the chat template's assistant closing {closing!r} does not start with its end-of-turn token "
                f"{end_of_turn_text!r}"
            )
        self._after_end_of_turn = closing[len(end_of_turn_text) :]
        self.observation_role, self._answer = self._answer_template(
            earlier, rendered, getattr(env, "observation_role", "user")
        )

        # Answers of the other speaker a task may relay (a simulated user beside tools, or tools beside a user).
        default_role = getattr(env, "observation_role", "user")
        self._answers = {default_role: (self.observation_role, self._answer)}
        if default_role != "user":
            self._answers["user"] = self._answer_template(earlier, rendered, "user")
        self._role_of = getattr(env, "observation_role_of", lambda observation: default_role)
        self.stop_token_ids = list(dict.fromkeys([self.end_of_turn_id, tokenizer.eos_token_id]))

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def _answer_template(self, earlier: list[dict], rendered: str, role: str) -> tuple[str, tuple[str, str]]:
        """(role, text before and after the answer) for an answer message after an agent turn."""
        roles = [role, "user"] if role != "user" else ["user"]
        for candidate in roles:
            try:
                extended = self._render([*earlier, {"role": candidate, "content": _CONTENT}], True)
            except Exception:  # a template without this role raises (e.g. "roles must alternate")
                continue
            if _CONTENT not in extended:
                continue  # the template dropped the message
            if not extended.startswith(rendered):
                raise ValueError(
                    "the chat template re-renders earlier messages when one is added, so an episode cannot be "
                    "tokenized incrementally; use a template that renders a conversation message by message"
                )
            return candidate, _split(extended[len(rendered) :], _CONTENT, f"a {candidate} message")
        raise ValueError(
            f"the chat template renders neither a {role!r} nor a 'user' message after an assistant message"
        )

    #: A list: the opening's chat messages as they are (a dataset's conversational prompt).
    opening_types = (str, list)

    def open(self, trajectory: Trajectory, first_observation: str | list[dict]) -> None:
        if isinstance(first_observation, list):
            rendered = self._render(first_observation, True)
            trajectory.extend_context(self._encode(rendered, "reset"))
            return
        before, after = self._opening
        trajectory.extend_context(self._encode(before + first_observation + after, "reset"))

    def add_observation(self, trajectory: Trajectory, observation: str) -> None:
        role = self._role_of(observation)
        if role not in self._answers:
            raise ValueError(
                f"{self.env_name}.observation_role_of answered {role!r}: expected one of {sorted(self._answers)}"
            )
        before, after = self._answers[role][1]
        closed = trajectory.token_ids and trajectory.token_ids[-1] == self.end_of_turn_id
        ids = self._encode(self._after_end_of_turn + before + observation + after, "step")
        trajectory.extend_context(ids if closed else [self.end_of_turn_id, *ids])

    def action(self, turn_ids: list[int]) -> str:
        content = self.tokenizer.decode([i for i in turn_ids if i not in self.stop_token_ids], skip_special_tokens=True)
        return content if content.endswith(self.turn_stop) else content + self.turn_stop

    def demonstrated_turn_ids(self, action: str) -> list[int]:
        return [*self._encode(action.removesuffix(self.turn_stop), "demonstration"), self.end_of_turn_id]


def _split(text: str, marker: str, what: str) -> tuple[str, str]:
    if text.count(marker) != 1:
        raise ValueError(f"the chat template does not render the content of {what} verbatim (got {text!r})")
    before, after = text.split(marker)
    return before, after
