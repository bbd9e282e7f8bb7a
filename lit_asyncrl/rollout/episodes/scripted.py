"""Driving a task without an engine: scripted model turns played through one of its episodes
(`lit_asyncrl.rollout.play_scripted`).

A user's first check of a task (or of a third-party suite wrapped as one): write what the model would
say, turn by turn, and see what the task answers and how it grades the play, before any engine starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

from lit_asyncrl.envs.base import Environment


@dataclasses.dataclass(frozen=True)
class ScriptedPlay:
    """What a scripted play gave.

    Attributes:
        reward: the episode's return (the sum of the rewards of its transitions).
        success: whether the task counted the play solved (the last transition's `info["success"]`).
        ended: whether the task ended the episode (terminated or truncated) by the last scripted turn.
        opening: what the episode showed first (`reset`: text, chat messages, or a tool task's opening).
        exchanges: each model turn as scripted, with the task's answer to it (text, or a tool task's
            `ToolMessage`s and `UserMessage`s); turns after the episode ended are not played.
        transcript: a tool task's messages as its grader read them (OpenAI-style, the opening
            included); None for other tasks.
    """

    reward: float
    success: bool
    ended: bool
    opening: Any
    exchanges: list[tuple[str, Any]]
    transcript: list[dict[str, Any]] | None = None


def play_scripted(
    task: Environment,
    instance: Any,
    model_turns: Sequence[str],
    tool_parser: str = "hermes",
    tokenizer: Any = None,
    seed: int = 0,
    cut_off: str | None = None,
) -> ScriptedPlay:
    """Play `model_turns` (raw model text, one per agent turn) through an episode of `instance`.

    A tool task (`ToolEnv`) reads each turn with vLLM's tool parser `tool_parser` (what the run's
    `env.tool_parser` names) over `tokenizer` (the model's; None: the tiny policy's character tokenizer,
    which serves parsers whose call markers are plain text, as Hermes' are); any other task takes the
    text as it is. A mixture plays the instance with the task it belongs to. With `cut_off` (`"context"`,
    `"turns"` or `"timeout"`), an episode still going after the last scripted turn is stopped as a run
    stops one for that reason (`cut_off(reason)`, which a task that grades cut-offs answers with a grade).
    """
    played = task.task_of(instance)
    parse = _turn_reader(played.env, tool_parser, tokenizer)

    async def play() -> ScriptedPlay:
        episode = played.env.new_episode(played.instance)
        opening = await _settled(episode.reset(seed))
        reward = 0.0
        success = ended = False
        exchanges = []
        for text in model_turns:
            transition = await _settled(episode.step(parse(text)))
            exchanges.append((text, transition.observation))
            reward += transition.reward
            success = transition.success
            if transition.done:
                ended = True
                break
        stop = getattr(episode, "cut_off", None)
        if not ended and cut_off is not None and callable(stop):
            transition = await _settled(stop(cut_off))
            ended = True
            if transition is not None:
                reward += transition.reward
                success = transition.success
        return ScriptedPlay(reward, success, ended, opening, exchanges, getattr(episode, "transcript", None))

    return asyncio.run(play())


def _turn_reader(env: Environment, tool_parser: str, tokenizer: Any) -> Any:
    """What a scripted turn becomes before `step`: a tool task's parsed turn, any other task's text."""
    from lit_asyncrl.envs.tools import ToolEnv

    if not isinstance(env, ToolEnv):
        return lambda text: text
    from lit_asyncrl.models.char_tokenizer import build_char_tokenizer
    from lit_asyncrl.rollout.episodes.tool_calls import ToolCallParser

    return ToolCallParser(tool_parser, tokenizer if tokenizer is not None else build_char_tokenizer()).parse


async def _settled(result: Any) -> Any:
    """A sync method's value, or an `async def` one's, awaited."""
    return await result if inspect.isawaitable(result) else result
