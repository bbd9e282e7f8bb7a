"""Simulated users: the other side of an agent's conversation, as in tau2-bench.

A task with a user keeps some of what the agent needs on the user's side (tau2's customers know
their order, the agent's tools do not): the agent has to ask, and the user answers from a goal
the agent never sees. A `SimulatedUser` is a config object like an `Environment` (Hydra
`_target_`, Lightning CLI `class_path`), shared by every episode of a run; each episode passes
it its own goal and the conversation so far.

- `CooperativeUser` answers by rule from the goal's own answers: offline, instant, deterministic,
  and what the tasks' scripted demonstrations show.
- `ScriptedUser` says the goal's written turns in order, then ends the conversation (a dataset's
  follow-up requests, a benchmark's scripted user).
- `LLMUser` (`lit_asyncrl.envs.users.llm_user`) lets a frozen language model on its own vLLM engine
  play the user from the goal's instructions, as tau2 does with a hosted model.

`reply` is a coroutine: an episode awaits it on the engine's event loop, so a user that takes its
time (a model generating) holds up only its own episode. It answers one line of text, or None when
the user ends the conversation (a tool task's episode then ends; `envs/tools/user_turns.py`).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import NamedTuple, Protocol

from lit_asyncrl.envs.resources import EngineMaker


class Message(NamedTuple):
    """One message between the agent and the user."""

    speaker: str  # "agent" or "user"
    text: str


class UserGoal(Protocol):
    """What one episode's user wants and knows (the task decides its shape)."""

    #: The goal in words, for a user played by a language model (second person: "You want ...").
    instructions: str

    def answer(self, question: str) -> str:
        """The answer a cooperative user gives to `question` (the rule `CooperativeUser` plays)."""
        ...


class SimulatedUser(abc.ABC):
    """Answers the agent's messages to the user, from a goal the agent never sees.

    `start` and `close` bracket a run (the rollout service calls them): a user that needs a
    resource, like `LLMUser`'s engine, makes it in `start` and frees it in `close`.
    """

    def start(self, make_engine: EngineMaker | None = None) -> None:
        """Make what the user needs before the first episode, an engine with `make_engine` (no-op by default)."""
        return None

    def close(self) -> None:
        """Free what `start` made; safe to call twice and without `start` (no-op by default)."""
        return None

    @abc.abstractmethod
    async def reply(self, goal: UserGoal, conversation: Sequence[Message]) -> str | None:
        """The user's next message (one line of text), or None to end the conversation.
        `conversation` ends with the agent's message."""


class CooperativeUser(SimulatedUser):
    """A user who answers every question with the goal's own answer (`UserGoal.answer`)."""

    async def reply(self, goal: UserGoal, conversation: Sequence[Message]) -> str:
        if not conversation or conversation[-1].speaker != "agent":
            raise ValueError("CooperativeUser.reply: the conversation must end with the agent's message")
        return goal.answer(conversation[-1].text)


class ScriptedUser(SimulatedUser):
    """A user who says the goal's written turns (`goal.script`, a sequence of strings) in order, one
    per agent message after the opening, and ends the conversation once they are said."""

    async def reply(self, goal: UserGoal, conversation: Sequence[Message]) -> str | None:
        if not conversation or conversation[-1].speaker != "agent":
            raise ValueError("ScriptedUser.reply: the conversation must end with the agent's message")
        answered = sum(message.speaker == "agent" for message in conversation) - 1
        return goal.script[answered] if answered < len(goal.script) else None
