"""Plays one multi-turn episode against the engine, turn by turn, recording every token."""

from __future__ import annotations

from typing import Any

from lit_asyncrl.envs.base import Environment
from lit_asyncrl.rollout.engine import VLLMEngine
from lit_asyncrl.rollout.records import Trajectory


async def play_episode(
    engine: VLLMEngine,
    env: Environment,
    tokenizer: Any,
    instance: object,
    trajectory: Trajectory,
    *,
    temperature: float,
    top_k: int,
    max_context: int,
) -> Trajectory:
    """Alternate agent turns (sampled by the engine) and environment answers until done.

    Each turn is a new request on the whole context so far; the engine may swap weights in the
    middle of a turn, in which case the turn's tokens carry two versions (a partial rollout).
    """
    episode = env.new_episode(instance)
    trajectory.extend_context([tokenizer.bos_token_id, *_encode(tokenizer, episode.reset())])
    stop_ids = [_single_token_id(tokenizer, env.turn_stop), tokenizer.eos_token_id]
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
            stop_token_ids=stop_ids,
            # Provisional versions; the engine's final spans below are authoritative.
            on_tokens=lambda ids, logprobs: trajectory.extend_policy(ids, logprobs, [engine.version] * len(ids)),
        )
        trajectory.misattributed_scores += trajectory.set_versions(turn_start, turn.versions)
        trajectory.num_turns += 1
        result = episode.step(tokenizer.decode(turn.token_ids, skip_special_tokens=False))
        trajectory.reward += result.reward
        trajectory.success = trajectory.success or result.success
        if result.done:
            break
        trajectory.extend_context(_encode(tokenizer, result.observation))
    return trajectory


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) if text else []


def _single_token_id(tokenizer: Any, text: str) -> int:
    ids = _encode(tokenizer, text)
    if len(ids) != 1:
        raise ValueError(f"env.turn_stop={text!r} must be a single token of the policy's tokenizer, got ids {ids}")
    return ids[0]
