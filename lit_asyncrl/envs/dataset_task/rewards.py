"""A dataset task's reward functions, called as TRL's GRPOTrainer calls them.

Each is called with keyword arguments `prompts`, `completions` and `completion_ids` (lists with one
entry per completion scored) and every other column of the row by its name (each a list too), and
returns a list of floats, or None where it does not score a completion. It may be `async def`. The
reward of an episode is the weighted sum of the values that are not None; a function that returns
None or raises is left out of that sum and counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lit_asyncrl.envs.dataset_task.math_answers import MathVerifier
from lit_asyncrl.envs.dotted_paths import imported_callable

RewardFunction = Callable[..., Any]


def completion_text(completion: str | list[dict[str, str]]) -> str:
    """A completion's text: the string itself, or the last message's content (a conversational prompt's)."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


class ExactMatch:
    """1.0 when the completion, stripped, is the row's answer (its column), else 0.0."""

    def __init__(self, answer_key: str) -> None:
        self.answer_key = answer_key

    def __call__(self, completions: list[Any], **columns: Any) -> list[float]:
        answers = columns[self.answer_key]
        return [
            float(completion_text(completion).strip() == str(answer).strip())
            for completion, answer in zip(completions, answers)
        ]


class MathAnswer:
    """1.0 when `math-verify` finds the row's answer stated in the completion, else 0.0."""

    def __init__(self, answer_key: str, verifier: MathVerifier) -> None:
        self.answer_key = answer_key
        self.verifier = verifier

    def __call__(self, completions: list[Any], **columns: Any) -> list[float]:
        answers = columns[self.answer_key]
        return [
            float(self.verifier.check(answer, completion_text(completion)))
            for completion, answer in zip(completions, answers)
        ]


@dataclasses.dataclass(frozen=True)
class RewardTerm:
    name: str
    function: RewardFunction
    weight: float


@dataclasses.dataclass(frozen=True)
class Scores:
    """One completion's reward: the weighted sum, each function's value (None: not scored) and the
    functions that raised."""

    reward: float
    values: dict[str, float | None]
    failed: tuple[str, ...]


def reward_terms(
    names: Sequence[str], weights: Sequence[float] | None, answer_key: str, verifier: MathVerifier
) -> list[RewardTerm]:
    """The functions `env.rewards` names (built-in names or dotted paths), with `env.reward_weights`."""
    if not names:
        raise ValueError("env.rewards: name at least one reward function")
    if weights is not None and len(weights) != len(names):
        raise ValueError(f"env.reward_weights has {len(weights)} weights for {len(names)} env.rewards")
    built_in = {"exact_match": ExactMatch(answer_key), "math_verify": MathAnswer(answer_key, verifier)}
    terms = []
    for index, name in enumerate(names):
        function = built_in.get(name) or _imported(name)
        weight = 1.0 if weights is None else float(weights[index])
        terms.append(RewardTerm(name, function, weight))
    return terms


async def score(terms: Sequence[RewardTerm], prompt: Any, completion: Any, columns: Mapping[str, Any]) -> Scores:
    """Every term's value for one completion of the row `columns`, and their weighted sum."""
    arguments = {name: [value] for name, value in columns.items()}
    arguments |= {"prompts": [prompt], "completions": [completion], "completion_ids": [None]}
    values: dict[str, float | None] = {}
    failed = []
    for term in terms:
        try:
            returned = term.function(**arguments)
            if inspect.isawaitable(returned):
                returned = await returned
            value = None if returned is None else returned[0]
            values[term.name] = None if value is None else float(value)
        except Exception:  # a broken reward function is counted, not fatal: the episode scores without it
            values[term.name] = None
            failed.append(term.name)
    reward = sum(term.weight * values[term.name] for term in terms if values[term.name] is not None)
    return Scores(reward, values, tuple(failed))


def score_blocking(terms: Sequence[RewardTerm], prompt: Any, completion: Any, columns: Mapping[str, Any]) -> Scores:
    """`score` from a thread without an event loop (the task's steps run in a thread pool)."""
    return asyncio.run(score(terms, prompt, completion, columns))


def _imported(path: str) -> RewardFunction:
    if "." not in path:
        raise ValueError(
            f"env.rewards: {path!r} is neither a built-in (exact_match, math_verify) nor a dotted path to a function"
        )
    function = imported_callable(path, "env.rewards")
    parameters = inspect.signature(function).parameters.values()
    takes_any = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters)
    if not takes_any and "completions" not in {parameter.name for parameter in parameters}:
        raise ValueError(
            f"env.rewards: {path!r} takes neither `completions` nor **kwargs; a reward function is called as "
            "f(prompts=..., completions=..., completion_ids=..., **columns)"
        )
    return function
