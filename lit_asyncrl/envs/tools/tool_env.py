"""Tasks whose agent calls tools as chat models do: JSON function calls, answered by `tool` messages.

A `ToolEnv` sits on the text protocol of `envs/base.py` (`reset` / `step`): the episode runner is
the same, and only what crosses it is richer. `reset` answers a `ToolOpening` (the first messages
and the tool schemas) instead of a string; `step` receives the model's turn as the model's own tool
parser read it (an `AssistantTurn`: text and calls) instead of its raw text, and answers the calls'
results as `ToolMessage`s. The episode format (`rollout/episodes/tool_calls.py`) does the model's
side: it renders the schemas and results the way the model's chat template expects, and parses
each turn with vLLM's tool parser for the model (`tool_parser`), so a task never sees model syntax.

A task gives:
- `generate_instance(rng)`: an instance (as for every environment);
- `new_state(instance)`: what the tools act on, fresh for each episode;
- `tools(state)`: the tools over that state, plain functions (sync or `async def`, with type hints
  and an `Args:` docstring: `get_json_schema` makes their schema) or `Tool`s (a schema and a callable);
- `opening(instance)`: the first messages (e.g. the user's request);
- `grade(ending)`: the reward and whether the task was solved, from an `Ending` (the instance, the
  final state, the transcript as OpenAI-style messages, and why the episode ended), read once when
  the episode ends;
- optionally `finished(state)`: the episode ends after the turn in which it becomes True (e.g. a
  `reply` tool that answers the customer);
- optionally `turn_limit(instance)`: agent turns for this instance (by default `max_turns`);
- optionally a user (`user=`, any `SimulatedUser`) and `user_goal(state)`: an agent turn without a
  call is then a message to the user, whose answer continues the episode as a `user` message (None
  ends it); without a user, a turn without a call ends the episode.

Every ended episode is graded, with its reason (`endings.py`): the task's own endings, the turn limit,
and, for a task that sets `grades_cut_offs`, the run's cut-offs (the context filled, the time ran out);
a task that leaves it False keeps the call penalties alone as the reward of such an episode.

Calls of one turn run in order, each answered by one `tool` message. A call that cannot be run is
answered with an error the model can read, counted by reason (`calls.ERROR_REASONS`), and the
episode goes on: a turn whose call the parser could not read, an unknown tool, arguments that do
not match the schema, a tool that raises, a tool that runs past `tool_timeout_s` (a synchronous
tool's thread then finishes in the background: Python cannot stop it).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import inspect
import json
from collections import Counter
from typing import Any, NamedTuple

from lit_asyncrl.envs.base import Environment, Transition
from lit_asyncrl.envs.resources import EngineMaker
from lit_asyncrl.envs.tools import endings
from lit_asyncrl.envs.tools.arguments import ARGUMENT_CHECKS
from lit_asyncrl.envs.tools.calls import (
    INVALID_ARGUMENTS,
    TIMEOUT,
    TOOL_ERROR,
    UNKNOWN_TOOL,
    UNPARSABLE,
    AssistantTurn,
    ToolCall,
    ToolMessage,
    ToolOpening,
)
from lit_asyncrl.envs.tools.endings import Ending
from lit_asyncrl.envs.tools.tool import Tool, as_tool
from lit_asyncrl.envs.tools.user_turns import UserMessage, UserOpening, conversation_of
from lit_asyncrl.envs.users.simulated import SimulatedUser, UserGoal


class Grade(NamedTuple):
    """An episode's outcome: its reward and whether the task was solved (`info["success"]`)."""

    reward: float
    success: bool


class ToolEnv(Environment):
    """A task family whose agent calls tools; subclass it (see the module's docstring).

    Args:
        tool_parser: vLLM's tool parser for the policy's chat format (`hermes`, `llama3_json`, ...;
            `vllm.tool_parsers.ToolParserManager.list_registered()`); the default configs take it
            from `model.tool_parser`.
        tool_timeout_s: a call running longer is answered with a timeout error.
        call_error_reward: reward added for each call answered with an error (a timeout aside).
        max_turns: agent turns per episode (each may hold several calls); `turn_limit` may set it per instance.
        arguments: how a call's arguments are checked against its tool's schema: `strict` (as written)
            or `lenient` (also a number given as its exact JSON text in a string; `arguments.py`).
        user: who answers an agent turn without a call (None: such a turn ends the episode); the
            task's `user_goal` says what the user wants in each episode.
        latency_s, episode_timeout_s: see `Environment`.
    """

    observation_role = "tool"
    turn_stop = "\n"  # plain-text policies (the compact rendering) end a turn with a newline
    max_turn_tokens = 128
    #: Whether `grade` also scores an episode the run cut off by the context or the episode timeout
    #: (its `Ending.reason` says which); False keeps only the call penalties as its reward.
    grades_cut_offs = False

    def __init__(
        self,
        tool_parser: str = "hermes",
        tool_timeout_s: float = 10.0,
        call_error_reward: float = 0.0,
        max_turns: int = 4,
        arguments: str = "strict",
        user: SimulatedUser | None = None,
        latency_s: float = 0.0,
        episode_timeout_s: float | None = None,
    ) -> None:
        super().__init__(latency_s=latency_s, episode_timeout_s=episode_timeout_s)
        if user is not None and type(self).user_goal is ToolEnv.user_goal:
            raise ValueError(
                f"env.user is set but {type(self).__name__} has no user_goal(state): the user would not know "
                "what they want"
            )
        if arguments not in ARGUMENT_CHECKS:
            raise ValueError(f"env.arguments must be one of {', '.join(ARGUMENT_CHECKS)}, got {arguments!r}")
        if not isinstance(tool_parser, str) or not tool_parser:
            raise ValueError(f"env.tool_parser must name one of vLLM's tool parsers (e.g. hermes), got {tool_parser!r}")
        if tool_timeout_s <= 0:
            raise ValueError(f"env.tool_timeout_s must be > 0, got {tool_timeout_s}")
        if call_error_reward > 0:
            raise ValueError(f"env.call_error_reward must be <= 0 (a penalty), got {call_error_reward}")
        if max_turns < 1:
            raise ValueError(f"env.max_turns must be >= 1, got {max_turns}")
        self.tool_parser = tool_parser
        self.tool_timeout_s = float(tool_timeout_s)
        self.call_error_reward = float(call_error_reward)
        self.max_turns = max_turns
        self.arguments = arguments
        self.argument_check = ARGUMENT_CHECKS[arguments]()
        self.user = user

    @abc.abstractmethod
    def new_state(self, instance: Any) -> Any:
        """What the tools of one episode act on (fresh per episode)."""

    @abc.abstractmethod
    def tools(self, state: Any) -> list[Any]:
        """The tools over `state`: plain functions or `Tool`s."""

    @abc.abstractmethod
    def opening(self, instance: Any) -> list[dict[str, Any]]:
        """The episode's first messages (OpenAI-style dicts, e.g. `[{"role": "user", "content": ...}]`)."""

    @abc.abstractmethod
    def grade(self, ending: Ending) -> Grade:
        """The episode's reward and success, from how it ended (its instance, final state, messages and reason)."""

    def finished(self, state: Any) -> bool:
        """Whether the episode ends after the current turn (False by default)."""
        return False

    def user_goal(self, state: Any) -> UserGoal:
        """What the user wants and knows in the episode of `state` (tasks with a `user` give it)."""
        raise NotImplementedError(f"{type(self).__name__} has no user")

    def start(self, make_engine: EngineMaker | None = None) -> None:
        if self.user is not None:  # e.g. an LLMUser's engine, made with the runner's maker
            self.user.start(make_engine)

    def close(self) -> None:
        if self.user is not None:
            self.user.close()

    def new_episode(self, instance: Any) -> ToolEpisode:
        return ToolEpisode(self, instance)

    def demonstration_calls(self, instance: Any) -> list[list[ToolCall]]:
        """A scripted good play as the calls of each turn (an empty list: a turn without a call)."""
        raise NotImplementedError(f"{type(self).__name__} has no scripted demonstrations; set warm_start_steps=0")

    def demonstration(self, instance: Any) -> list[tuple[AssistantTurn, list[ToolMessage]]]:
        """`demonstration_calls` played against a fresh episode: each turn with the answers it got."""
        episode = self.new_episode(instance)
        turns = []
        asyncio.run(_reset_then(episode, self.demonstration_calls(instance), turns))
        return turns


async def _reset_then(episode: ToolEpisode, plays: list[list[ToolCall]], turns: list) -> None:
    opening = episode.reset()
    if inspect.isawaitable(opening):
        await opening
    for calls in plays:
        turn = AssistantTurn("", tuple(calls))
        result = await episode.step(turn)
        turns.append((turn, list(result.observation)))
        if result.done:
            break


class ToolEpisode:
    """One episode of a `ToolEnv`: its state, its tools by name, its transcript."""

    def __init__(self, env: ToolEnv, instance: Any) -> None:
        self.env = env
        self.instance = instance
        self.state = env.new_state(instance)
        tools = [as_tool(tool) for tool in env.tools(self.state)]
        self.tools: dict[str, Tool] = {tool.name: tool for tool in tools}
        if len(self.tools) != len(tools):
            raise ValueError(
                f"{type(env).__name__}.tools gives two tools of the same name: {[tool.name for tool in tools]}"
            )
        self.transcript: list[dict[str, Any]] = []
        self.turns = 0

    def reset(self, seed: int | None = None) -> ToolOpening | UserOpening:
        """The opening; a `UserOpening` to await when the user speaks first (the opening ends with the
        agent's greeting, as tau2's conversations do, and the user's answer to it opens the request)."""
        messages = tuple(self.env.opening(self.instance))
        self.transcript = list(messages)
        opening = ToolOpening(messages, tuple(tool.schema for tool in self.tools.values()))
        if self.env.user is not None and messages and messages[-1]["role"] == "assistant":
            return UserOpening(opening, self._user_opens)
        return opening

    async def _user_opens(self, opening: ToolOpening) -> ToolOpening:
        reply = await self._user_reply()
        if reply is None:
            raise ValueError(f"{type(self.env).__name__}: the user ended the conversation before saying anything")
        message = UserMessage(reply).message()
        self.transcript.append(message)
        return dataclasses.replace(opening, messages=(*opening.messages, message))

    async def _user_reply(self) -> str | None:
        reply = self.env.user.reply(self.env.user_goal(self.state), conversation_of(self.transcript))
        return await reply if inspect.isawaitable(reply) else reply  # a user may answer sync or async

    async def step(self, turn: AssistantTurn) -> Transition:
        self.turns += 1
        self.transcript.append(turn.message())
        if turn.unparsable:
            answers = [
                ToolMessage("Error: the tool call could not be parsed (write it as valid JSON)", error=UNPARSABLE)
            ]
        elif turn.calls:
            answers = [await self._run(call) for call in turn.calls]
        elif self.env.user is None:
            return await self._end(endings.NO_CALL, answers=[])
        else:
            reply = await self._user_reply()
            if reply is None:
                return await self._end(endings.USER_ENDED, answers=[])
            answers = [UserMessage(reply)]
        self.transcript += [answer.message() for answer in answers]
        if self.env.finished(self.state):
            return await self._end(endings.FINISHED, answers=answers)
        if self.turns >= self.env.turn_limit(self.instance):
            return await self._end(endings.TURNS, answers=answers)
        return Transition(answers, self._penalty(answers), terminated=False, truncated=False, info=_counts(answers))

    async def cut_off(self, reason: str) -> Transition | None:
        """The episode's grade when the run stopped it (`endings.CONTEXT` or `endings.TIMEOUT`), for a
        task that grades cut-offs; None (nothing added) for one that does not."""
        return await self._end(reason, answers=[]) if self.env.grades_cut_offs else None

    async def _end(self, reason: str, answers: list[ToolMessage | UserMessage]) -> Transition:
        ending = Ending(self.instance, self.state, list(self.transcript), reason)
        # In a thread: a grader may take its time (tau2's evaluator replays the conversation on fresh
        # databases), and the engine's loop streams every other episode meanwhile.
        reward, success = await asyncio.to_thread(self.env.grade, ending)
        info = {**_counts(answers), "success": bool(success)}
        terminated = not ending.cut_off
        return Transition(
            answers, float(reward) + self._penalty(answers), terminated=terminated, truncated=not terminated, info=info
        )

    def _penalty(self, answers: list[ToolMessage | UserMessage]) -> float:
        calls = [answer for answer in answers if isinstance(answer, ToolMessage)]
        return self.env.call_error_reward * sum(answer.error not in (None, TIMEOUT) for answer in calls)

    async def _run(self, call: ToolCall) -> ToolMessage:
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.tools)
            return ToolMessage(
                f"Error: there is no tool named {call.name!r} (the tools: {known})",
                call.name,
                call.call_id,
                UNKNOWN_TOOL,
            )
        checked = self.env.argument_check.check(tool, call.arguments)
        if checked.problem is not None:
            return ToolMessage(
                f"Error: invalid arguments for {call.name}: {checked.problem}",
                call.name,
                call.call_id,
                INVALID_ARGUMENTS,
            )
        try:
            result = await asyncio.wait_for(_call(tool, checked.arguments), self.env.tool_timeout_s)
        except TimeoutError:
            return ToolMessage(
                f"Error: {call.name} took longer than {self.env.tool_timeout_s:g} s", call.name, call.call_id, TIMEOUT
            )
        except Exception as error:  # the tool's own failure is the model's to read, not the run's
            return ToolMessage(f"Error: {call.name} failed: {error}", call.name, call.call_id, TOOL_ERROR)
        return ToolMessage(_as_text(result), call.name, call.call_id, coerced=checked.coerced)


async def _call(tool: Tool, arguments: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(tool.function):
        return await tool.function(**arguments)
    result = await asyncio.to_thread(tool.function, **arguments)  # a slow sync tool never stalls the loop
    return await result if inspect.isawaitable(result) else result


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except TypeError:
        return str(result)


def _counts(answers: list[ToolMessage | UserMessage]) -> dict[str, dict[str, int]]:
    """A turn's calls by tool, its errors by reason and its calls whose arguments a lenient check
    took from strings, by tool (the runner adds them up per episode)."""
    answers = [answer for answer in answers if isinstance(answer, ToolMessage)]
    # By the tools of the task only: a name the model made up is an error, not a new metric.
    calls = Counter(answer.name for answer in answers if answer.name is not None and answer.error != UNKNOWN_TOOL)
    errors = Counter(answer.error for answer in answers if answer.error is not None)
    coerced = Counter(answer.name for answer in answers if answer.coerced)
    return {"tool_calls": dict(calls), "tool_call_errors": dict(errors), "tool_call_coercions": dict(coerced)}
