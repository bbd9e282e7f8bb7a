"""Plays one multi-turn episode against the engine, turn by turn, recording every token."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lit_asyncrl.envs.agent_program import AgentTask
from lit_asyncrl.envs.base import Environment, TextEnv, Transition
from lit_asyncrl.rollout.engine.protocol import Engine, TurnOutput
from lit_asyncrl.rollout.episodes.env_calls import EnvCaller
from lit_asyncrl.rollout.episodes.formats import EpisodeFormat
from lit_asyncrl.rollout.episodes.replay import EpisodeReplay, RecordedTurn, ReplayMismatch, append_recorded
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.records import Trajectory
from lit_asyncrl.text import UnencodableTextError

if TYPE_CHECKING:  # for the annotation only: the runner needs nothing of the endpoint to play other tasks
    from lit_asyncrl.rollout.agent_endpoint.server import AgentEndpoint


@dataclasses.dataclass(frozen=True)
class EpisodeSettings:
    """How `play_episode` plays one episode, besides the engine, task, format and trajectory it plays it on.

    Attributes:
        call_env: runs the environment's calls without blocking the engine's loop (`EnvCaller`).
        sampling: the policy's sampling settings, for every turn.
        max_context: the engine's context in tokens; an episode that fills it ends (`cut_off="context"`).
        seed: the environment's reset seed (None: the environment's own).
        recorded: the episode as a checkpoint recorded it in flight: its answered turns are replayed,
            not sampled, and sampling goes on after them (None: a new episode).
        agent_endpoint: the run's endpoint for agent programs (`AgentTask`); None for other tasks.
    """

    call_env: EnvCaller
    sampling: SamplingSettings
    max_context: int
    seed: int | None = None
    recorded: Trajectory | None = None
    agent_endpoint: AgentEndpoint | None = None


async def play_episode(
    engine: Engine,
    env: Environment,
    episode_format: EpisodeFormat,
    instance: object,
    trajectory: Trajectory,
    settings: EpisodeSettings,
) -> Trajectory:
    """Alternate agent turns (sampled by the engine) and environment answers until done.

    `episode_format` puts the tokens around the environment's text (raw text or the chat template)
    and says where a turn stops. Each turn is a new request on the whole context so far (the
    trajectory's own ids, never a re-tokenized conversation); the engine may swap weights in the
    middle of a turn, in which case the turn's tokens carry two versions (a partial rollout).
    An episode that outlives `env.episode_timeout_s` ends there, keeping its tokens and the reward
    it had (`trajectory.timed_out`); a turn cut short keeps the versions streamed so far. An episode
    the run stopped (timeout, full context, turn limit) before the task ended it is told so through
    its `cut_off(reason)`, when it has one, and the Transition it answers is added (a graded cut-off). An
    environment call that raises, or answers with something that is not a Transition or cannot be
    encoded, ends the episode as failed (`trajectory.env_failure`): the environment's fault, not the
    agent's, so the producer drops it with that reason instead of training on it. Errors of the
    engine are not the environment's and propagate. With `settings.recorded` (an episode in flight at
    a checkpoint, `replay.py`) its answered turns are replayed, not sampled, and sampling goes on
    after them; an environment that answers otherwise fails the episode with the reason "restart".
    """
    episode = env.new_episode(instance)
    started = time.monotonic()
    try:
        ended_by_task = False
        try:
            async with asyncio.timeout(env.episode_timeout_s):
                turn_limit = env.turn_limit(instance)
                ended_by_task = await _play_turns(
                    engine, env, episode, episode_format, trajectory, settings, turn_limit
                )
        except TimeoutError:
            trajectory.timed_out = True
        cut_off = "timeout" if trajectory.timed_out else trajectory.cut_off
        if cut_off is not None and not ended_by_task and trajectory.committed > 0:  # opened, then stopped by the run
            await _cut_off(settings.call_env, env, episode, trajectory, cut_off)
    except EnvironmentFailure as failure:
        trajectory.env_failure = failure.reason
        trajectory.env_failure_message = str(failure)
    except ReplayMismatch as mismatch:
        trajectory.env_failure = "restart"
        trajectory.env_failure_message = str(mismatch)
    finally:
        trajectory.duration_s = time.monotonic() - started
        trajectory.finished = True
        close = getattr(episode, "close", None)
        if callable(close):
            try:
                await settings.call_env(close)
            except Exception as error:  # a failing close loses nothing the episode produced
                trajectory.env_failure = trajectory.env_failure or "env_error"
                trajectory.env_failure_message = (
                    trajectory.env_failure_message or f"{type(env).__name__} close: {error!r}"
                )
    return trajectory


async def play_instance(
    engine: Engine,
    env: Environment,
    episode_formats: Mapping[str | None, EpisodeFormat],
    instance: object,
    trajectory: Trajectory,
    settings: EpisodeSettings,
) -> Trajectory:
    """`play_episode` of `instance` by the task that owns it (`env.task_of`: the environment itself,
    or one task of a mixture), in that task's format; the trajectory records the task's name."""
    task = env.task_of(instance)
    trajectory.task = task.name
    if isinstance(task.env, AgentTask):  # an agent program plays through the endpoint, not step by step
        from lit_asyncrl.rollout.agent_endpoint.episodes import play_agent_episode

        play = play_agent_episode
    else:
        play = play_episode
    return await play(engine, task.env, episode_formats[task.name], task.instance, trajectory, settings)


class EnvironmentFailure(Exception):
    """An environment call of one episode failed; `reason` is "env_error" or "env_malformed"."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


async def _env_call(call_env: EnvCaller, env: Environment, method: Any, *args: Any) -> Any:
    try:
        return await call_env(method, *args)
    except (asyncio.CancelledError, TimeoutError):
        raise
    except Exception as error:
        raise EnvironmentFailure("env_error", f"{type(env).__name__}.{method.__name__} raised {error!r}") from error


async def _cut_off(
    call_env: EnvCaller, env: Environment, episode: TextEnv, trajectory: Trajectory, reason: str
) -> None:
    """Tell an episode the run stopped it for `reason`, when it asks to be told (`cut_off`), and add what it answers."""
    cut_off = getattr(episode, "cut_off", None)
    if not callable(cut_off):
        return
    result = await _env_call(call_env, env, cut_off, reason)
    if result is not None:
        _add_transition(trajectory, _as_transition(result, env))


def _add_transition(trajectory: Trajectory, result: Transition) -> None:
    trajectory.reward += float(result.reward)
    trajectory.success = trajectory.success or result.success
    trajectory.record_step_info(result.info)


async def _play_turns(
    engine: Engine,
    env: Environment,
    episode: TextEnv,
    episode_format: EpisodeFormat,
    trajectory: Trajectory,
    settings: EpisodeSettings,
    turn_limit: int,
) -> bool:
    """Play the episode's turns; True when the task ended it, False when the run did (`trajectory.cut_off`)."""
    replay = EpisodeReplay(settings.recorded) if settings.recorded is not None else None
    first_observation = await _env_call(settings.call_env, env, episode.reset, settings.seed)
    await asyncio.sleep(env.latency_s)  # simulated latency holds no worker
    _add_observation(episode_format.open, episode_format.opening_types, trajectory, first_observation, env)
    trajectory.committed = len(trajectory.token_ids)
    if replay is not None:
        replay.check(trajectory)
    for index in range(turn_limit):
        room = settings.max_context - len(trajectory.token_ids)
        if room < 1:
            trajectory.cut_off = "context"
            return False
        trajectory.turn_starts.append(len(trajectory.token_ids))
        recorded = replay.turn(trajectory, index) if replay is not None else None
        turn = await _take_turn(
            engine, episode_format, trajectory, recorded, min(env.max_turn_tokens, room), settings.sampling
        )
        trajectory.num_turns += 1
        trajectory.committed = len(trajectory.token_ids)
        if turn.finish_reason == "length" and room < env.max_turn_tokens:
            trajectory.cut_off = "context"  # the turn ran into the end of the context, not its own limit
        result = _as_transition(
            await _env_call(settings.call_env, env, episode.step, episode_format.action(turn.token_ids)), env
        )
        await asyncio.sleep(env.latency_s)
        _add_transition(trajectory, result)
        if result.terminated or result.truncated:
            return True
        add = episode_format.add_observation
        _add_observation(add, episode_format.observation_types, trajectory, result.observation, env)
        trajectory.committed = len(trajectory.token_ids)
        if replay is not None:
            replay.check(trajectory)
    trajectory.cut_off = trajectory.cut_off or "turns"
    return False


async def _take_turn(
    engine: Engine,
    episode_format: EpisodeFormat,
    trajectory: Trajectory,
    recorded: RecordedTurn | None,
    max_tokens: int,
    sampling: SamplingSettings,
) -> TurnOutput:
    """One agent turn: as recorded (a resumed episode's answered turn), else sampled."""
    if recorded is not None:
        append_recorded(trajectory, recorded)
        return TurnOutput(
            recorded.token_ids,
            recorded.logprobs,
            recorded.versions,
            "length" if len(recorded.token_ids) >= max_tokens else "stop",
        )
    turn_start = len(trajectory.token_ids)
    turn = await engine.generate(
        list(trajectory.token_ids),
        max_tokens=max_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        stop_token_ids=episode_format.stop_token_ids,
        # Provisional versions; the engine's final spans below are authoritative.
        on_tokens=lambda ids, logprobs: trajectory.extend_policy(ids, logprobs, [engine.version] * len(ids)),
    )
    trajectory.misattributed_scores += trajectory.set_versions(turn_start, turn.versions)
    if turn.routed_experts is not None:
        trajectory.record_routing(turn.routed_experts)
    return turn


def _add_observation(
    add: Any, allowed: tuple[type, ...], trajectory: Trajectory, observation: Any, env: Environment
) -> None:
    """`add` (the format's `open` or `add_observation`) an answer of the environment of a type in `allowed`."""
    if not isinstance(observation, allowed):
        expected = " or ".join(kind.__name__ for kind in allowed)
        raise EnvironmentFailure(
            "env_malformed", f"{type(env).__name__}: observations must be {expected}, got {observation!r}"
        )
    try:
        add(trajectory, observation)
    except UnencodableTextError as error:
        raise EnvironmentFailure("env_malformed", str(error)) from error


def _as_transition(result: Any, env: Environment) -> Transition:
    # A plain gymnasium-style 5-tuple is accepted too; anything else is the environment's bug.
    if isinstance(result, tuple) and len(result) == 5:
        transition = Transition(*result)
        try:
            reward = float(transition.reward)
        except (TypeError, ValueError):
            reward = math.nan
        if math.isfinite(reward) and isinstance(transition.info, dict):
            return transition._replace(reward=reward)
    raise EnvironmentFailure(
        "env_malformed",
        f"{type(env).__name__}: step() must return a Transition (observation, reward: a finite number, terminated, "
        f"truncated, info: a dict), got {result!r}",
    )
