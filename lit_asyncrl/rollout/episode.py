"""Plays one multi-turn episode against the engine, turn by turn, recording every token."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from lit_asyncrl.envs.base import Environment, Transition
from lit_asyncrl.rollout.engine import VLLMEngine
from lit_asyncrl.rollout.env_calls import EnvCaller
from lit_asyncrl.rollout.episode_format import EpisodeFormat
from lit_asyncrl.rollout.records import Trajectory


async def play_episode(
    engine: VLLMEngine,
    env: Environment,
    episode_format: EpisodeFormat,
    instance: object,
    trajectory: Trajectory,
    *,
    call_env: EnvCaller,
    temperature: float,
    top_k: int,
    max_context: int,
    seed: int | None = None,
) -> Trajectory:
    """Alternate agent turns (sampled by the engine) and environment answers until done.

    `episode_format` puts the tokens around the environment's text (raw text or the chat template)
    and says where a turn stops. Each turn is a new request on the whole context so far (the
    trajectory's own ids, never a re-tokenized conversation); the engine may swap weights in the
    middle of a turn, in which case the turn's tokens carry two versions (a partial rollout).
    An episode that outlives `env.episode_timeout_s` ends there, keeping its tokens and the reward
    it had (`trajectory.timed_out`); a turn cut short keeps the versions streamed so far.
    """
    episode = env.new_episode(instance)
    started = time.monotonic()
    try:
        async with asyncio.timeout(env.episode_timeout_s):
            await _play_turns(engine, env, episode, episode_format, trajectory, call_env, temperature, top_k, max_context, seed)
    except TimeoutError:
        trajectory.timed_out = True
    finally:
        trajectory.duration_s = time.monotonic() - started
        close = getattr(episode, "close", None)
        if callable(close):
            await call_env(close)
    return trajectory


async def _play_turns(engine, env, episode, episode_format, trajectory, call_env, temperature, top_k, max_context, seed) -> None:
    first_observation = await call_env(episode.reset, seed)
    await asyncio.sleep(env.latency_s)  # simulated latency holds no worker
    episode_format.open(trajectory, first_observation)
    for _ in range(env.max_turns):
        room = max_context - len(trajectory.token_ids)
        if room < 1:
            break
        turn_start = len(trajectory.token_ids)
        turn = await engine.generate(
            list(trajectory.token_ids),
            max_tokens=min(env.max_turn_tokens, room),
            temperature=temperature,
            top_k=top_k,
            stop_token_ids=episode_format.stop_token_ids,
            # Provisional versions; the engine's final spans below are authoritative.
            on_tokens=lambda ids, logprobs: trajectory.extend_policy(ids, logprobs, [engine.version] * len(ids)),
        )
        trajectory.misattributed_scores += trajectory.set_versions(turn_start, turn.versions)
        trajectory.num_turns += 1
        result = _as_transition(await call_env(episode.step, episode_format.action_text(turn.token_ids)), env)
        await asyncio.sleep(env.latency_s)
        trajectory.reward += float(result.reward)
        trajectory.success = trajectory.success or result.success
        if result.terminated or result.truncated:
            break
        episode_format.add_observation(trajectory, result.observation)


def _as_transition(result: Any, env: Environment) -> Transition:
    # A plain gymnasium-style 5-tuple is accepted too; anything else is the environment's bug.
    if isinstance(result, Transition):
        return result
    if isinstance(result, tuple) and len(result) == 5:
        return Transition(*result)
    raise TypeError(
        f"{type(env).__name__}: step() must return a Transition (observation, reward, terminated, truncated, info), got {result!r}"
    )
