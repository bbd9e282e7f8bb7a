"""Plays one episode of an agent program: its client bound to the episode's URL, its outcome as the reward.

The agent runs on the engine's event loop like any episode; its calls reach the endpoint's application
(in this process through httpx's ASGI transport, on this loop; from another process over loopback HTTP)
and are sampled on this loop. An episode ends when the agent returns. It is dropped,
with a counted reason (`rollout/dropped_<reason>`), when the agent raises (`agent_error`), returns no
reward (`agent_malformed`), outlives `env.episode_timeout_s` (`agent_timeout`) or disconnects during a
call (`agent_disconnected`): a call in flight then has its engine request cancelled.

A checkpoint taken while an agent episode is in flight cannot continue it: the agent's own state (its
loop, its variables, its tools' side effects) is not the run's to record. A resumed run plays such an
episode again from its start (the group's finished episodes are kept as they were).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from lit_asyncrl.envs.agent_program import AgentTask, ExternalAgentEnv, agent_outcome
from lit_asyncrl.rollout.agent_endpoint.conversation import AgentConversation
from lit_asyncrl.rollout.agent_endpoint.server import AgentEpisode
from lit_asyncrl.rollout.engine.protocol import Engine
from lit_asyncrl.rollout.episodes.tool_calls import ChatToolFormat, CompactToolFormat
from lit_asyncrl.rollout.records import Trajectory

if TYPE_CHECKING:
    from lit_asyncrl.rollout.episodes.runner import EpisodeSettings

#: Reasons an agent episode is dropped (besides `agent_disconnected`, the endpoint's).
AGENT_ERROR = "agent_error"
AGENT_MALFORMED = "agent_malformed"
AGENT_TIMEOUT = "agent_timeout"


class Failure(NamedTuple):
    """Why an agent episode is dropped, and the message the failure-rate stop quotes."""

    reason: str
    message: str


async def play_agent_episode(
    engine: Engine,
    env: AgentTask,
    episode_format: ChatToolFormat | CompactToolFormat,
    instance: Any,
    trajectory: Trajectory,
    settings: EpisodeSettings,
) -> Trajectory:
    """Run `env`'s agent on `instance` with a client bound to a new episode of the run's endpoint; the
    episode's segments are `trajectory` and its `later_segments`, all with the agent's outcome."""
    endpoint = settings.agent_endpoint
    if endpoint is None:
        raise RuntimeError(f"{type(env).__name__} needs the run's agent endpoint (EpisodeSettings.agent_endpoint)")
    conversation = AgentConversation(episode_format, trajectory)
    episode = AgentEpisode(conversation, engine, settings.sampling, env.max_turn_tokens, settings.max_context)
    episode.instance = instance
    base_url = endpoint.open_episode(episode)
    started = time.monotonic()
    deadline = asyncio.timeout(env.episode_timeout_s)
    failure: Failure | None = None
    try:
        await asyncio.sleep(env.latency_s)
        async with deadline:
            if isinstance(env, ExternalAgentEnv):
                returned = await endpoint.offer(episode)
            else:  # an external agent has a client of its own, given the URL when it claims the episode
                returned = await env.run(endpoint.client_for(base_url), instance)
    except TimeoutError as error:
        # The run's deadline, or a timeout of the agent's own (which is the agent's failure).
        failure = Failure(AGENT_TIMEOUT, _timeout_message(env, episode)) if deadline.expired() else _raised(env, error)
    except Exception as error:  # the agent's own failure: its episode is dropped, the run goes on
        failure = _raised(env, error)
    else:
        try:
            outcome = agent_outcome(returned)
            trajectory.reward = outcome.reward
            trajectory.success = outcome.success
        except ValueError as error:
            failure = Failure(AGENT_MALFORMED, f"{type(env).__name__}: {error}")
    finally:
        endpoint.close_episode(episode)
        # The cause counts: a call the agent left in flight (a disconnection) before the error it then raised,
        # but the run's deadline before the disconnection that it made.
        if conversation.dropped is not None and (failure is None or failure.reason == AGENT_ERROR):
            failure = Failure(conversation.dropped, f"{type(env).__name__}: {conversation.dropped}")
        if failure is not None:
            trajectory.env_failure = failure.reason
            trajectory.env_failure_message = failure.message
        for segment in trajectory.segments:
            segment.duration_s = time.monotonic() - started
            segment.finished = True
            segment.task = trajectory.task
            segment.reward = trajectory.reward
            segment.success = trajectory.success
    return trajectory


def _timeout_message(env: AgentTask, episode: AgentEpisode) -> str:
    if isinstance(env, ExternalAgentEnv) and not episode.claimed:
        return (
            f"{type(env).__name__}: no agent claimed the episode within {env.episode_timeout_s} s (is your agent "
            f"running? it finds the endpoint in {env.connection_file})"
        )
    return f"{type(env).__name__}: the agent did not return within {env.episode_timeout_s} s"


def _raised(env: AgentTask, error: BaseException) -> Failure:
    return Failure(AGENT_ERROR, f"{type(env).__name__}.agent raised {error!r}")
