"""Agents as programs: a task whose episodes are an agent's own code calling the policy like an OpenAI model.

An agent written against the OpenAI SDK (a loop over `chat.completions.create` with `tools=`, running the
calls itself) trains as it is: each episode is `await agent(client, instance)`, where `client` is an
`openai.AsyncOpenAI` bound to the episode (the run's endpoint records every call's exact token ids,
per-token versions and log-probs under it, `lit_asyncrl.rollout.agent_endpoint`), and what the agent returns
is the episode's outcome: a number (the reward; success when it is positive) or a mapping with `reward`
and, optionally, `success`. The group's episodes play the same instance, drawn by `instances(rng)`.

There is no `step`: the agent decides what it sends and when it stops. What an agent may ask and what
rewriting its history costs is the endpoint's to say (docs/agents.md).
"""

from __future__ import annotations

import inspect
import json
import math
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

from lit_asyncrl.envs.base import Environment, TextEnv
from lit_asyncrl.envs.dotted_paths import imported_callable

#: `async def agent(client: openai.AsyncOpenAI, instance) -> float | Mapping`: one episode.
AgentProgram = Callable[[Any, Any], Awaitable[Any]]
#: `instances(rng: random.Random) -> instance`: one task instance (JSON-like values for an external agent).
InstanceDraw = Callable[[random.Random], Any]


class AgentOutcome(NamedTuple):
    """What an episode of an agent program scored."""

    reward: float
    success: bool


class AgentTask(Environment):
    """A task whose episodes an agent plays by calling the policy through the run's chat endpoint, in this
    process (`AgentProgramEnv`) or in another (`ExternalAgentEnv`).

    Args:
        instances: draws a task instance from a `random.Random`, or its dotted path.
        tool_parser: vLLM's tool parser that reads the policy's calls (`hermes` for SmolLM2, Qwen2.5, the
            tiny policy's compact rendering).
        max_turn_tokens: most tokens of one answer (a request's `max_tokens` may ask for fewer).
        turn_stop: plain-text policies only (no chat template): the single token that ends an answer.
        held_out_fraction: share of the instances (by a stable hash of their repr) kept for evaluation.
        episode_timeout_s: an episode whose agent has not returned by then is dropped ("agent_timeout").
        latency_s: see `Environment` (added before the agent starts).
    """

    observation_role = "tool"
    system_prompt = None

    def __init__(
        self,
        instances: str | InstanceDraw,
        tool_parser: str = "hermes",
        max_turn_tokens: int = 64,
        turn_stop: str = "\n",
        held_out_fraction: float = 0.2,
        episode_timeout_s: float = 300.0,
        latency_s: float = 0.0,
    ) -> None:
        super().__init__(latency_s=latency_s, episode_timeout_s=episode_timeout_s)
        self.draw = imported_callable(instances, "env.instances") if isinstance(instances, str) else instances
        if max_turn_tokens < 1:
            raise ValueError(f"env.max_turn_tokens must be >= 1, got {max_turn_tokens}")
        if not 0 <= held_out_fraction < 1:
            raise ValueError(f"env.held_out_fraction must be in [0, 1), got {held_out_fraction}")
        self.tool_parser = tool_parser
        self.max_turn_tokens = max_turn_tokens
        self.turn_stop = turn_stop
        self.held_out_fraction = held_out_fraction

    def generate_instance(self, rng: random.Random) -> Any:
        return self.draw(rng)

    def new_episode(self, instance: Any) -> TextEnv:
        raise TypeError(
            f"{type(self).__name__} has no step-by-step episodes: its agent plays them through the run's "
            "agent endpoint (lit_asyncrl.rollout.agent_endpoint)"
        )


class AgentProgramEnv(AgentTask):
    """A task played by an agent program in this process (see the module's docstring).

    Args:
        agent: the agent, an `async def (client, instance)`, or its dotted path (`mypackage.agent.solve`).
        instances, tool_parser, max_turn_tokens, turn_stop, held_out_fraction, episode_timeout_s,
            latency_s: see `AgentTask`.
    """

    def __init__(self, agent: str | AgentProgram, instances: str | InstanceDraw, **settings: Any) -> None:
        super().__init__(instances, **settings)
        self.agent = imported_callable(agent, "env.agent") if isinstance(agent, str) else agent
        if not inspect.iscoroutinefunction(self.agent):
            raise ValueError(
                f"env.agent: {getattr(self.agent, '__qualname__', self.agent)!r} must be an `async def "
                "(client, instance)`: episodes run concurrently on the engine's event loop"
            )

    async def run(self, client: Any, instance: Any) -> Any:
        """One episode: the agent program with its client (a subclass may play it otherwise)."""
        return await self.agent(client, instance)


class ExternalAgentEnv(AgentTask):
    """A task played by an agent in another process or language, over HTTP (`docs/agents.md`).

    The run writes `connection_file` (the endpoint's URL and bearer token, readable by its owner only;
    removed when the run ends). The agent claims an episode (`POST <url>/episodes/claim`: its id, its
    base URL for an OpenAI client and its instance, drawn by `instances` as JSON values), calls the policy
    at that base URL, and posts the outcome (`POST <url>/episodes/<id>/outcome`, `{"reward": r,
    "success": b}`). An episode nobody claims or finishes within `episode_timeout_s` is dropped
    ("agent_timeout").

    Args:
        connection_file: where the run writes the endpoint's URL and token for the agent.
        instances, tool_parser, max_turn_tokens, turn_stop, held_out_fraction, episode_timeout_s,
            latency_s: see `AgentTask`.
    """

    def __init__(self, connection_file: str, instances: str | InstanceDraw, **settings: Any) -> None:
        super().__init__(instances, **settings)
        if not connection_file:
            raise ValueError(
                "env.connection_file: a path is needed (the run writes the endpoint's URL and token there)"
            )
        self.connection_file = connection_file

    def generate_instance(self, rng: random.Random) -> Any:
        instance = super().generate_instance(rng)
        try:
            json.dumps(instance, allow_nan=False)  # as the endpoint sends it
        except (TypeError, ValueError) as error:
            raise ValueError(f"env.instances: an external agent receives its instance as JSON: {error}") from error
        return instance


def agent_outcome(returned: Any) -> AgentOutcome:
    """What an agent returned as an outcome, or a ValueError saying what it should have returned."""
    if isinstance(returned, Mapping):
        reward = _finite(returned.get("reward"))
        success = returned.get("success", reward is not None and reward > 0)
        if reward is None or not isinstance(success, bool):
            raise ValueError(
                "an agent's outcome mapping needs a finite number `reward` (and `success`, if given, a bool), "
                f"got {returned!r}"
            )
        return AgentOutcome(reward, success)
    reward = None if isinstance(returned, bool) else _finite(returned)
    if reward is None:
        raise ValueError(
            f"an agent must return its reward (a finite number) or a mapping with `reward`, got {returned!r}"
        )
    return AgentOutcome(reward, reward > 0)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)
