"""Prompts from a dataset file, scored by reward functions: RL from verifiable rewards (`env=dataset`).

One row is one task instance and one single-turn episode: the prompt is shown, the policy answers,
the reward functions (`rewards.py`) score the answer. The samples of one prompt form its advantage
group. Training plays the rows in epochs, each in an order shuffled by the run's seed. Held-out rows
come from a second file (`eval_path`), from a column (`split_key`), or from a stable hash of the
prompt (`held_out_fraction`), in that order of precedence.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Sequence
from typing import Any

from lit_asyncrl.envs.base import Environment, Transition
from lit_asyncrl.envs.dataset_task.math_answers import MathVerifier
from lit_asyncrl.envs.dataset_task.rewards import RewardTerm, reward_terms, score_blocking
from lit_asyncrl.envs.dataset_task.rows import read_rows, require_columns

#: A prompt: a string (the user message) or chat messages ({"role": ..., "content": ...}) used as they are.
Prompt = str | list[dict[str, str]]


class DatasetEpisode:
    def __init__(
        self, prompt: Prompt, columns: dict[str, Any], terms: Sequence[RewardTerm], settings: DatasetEpisodeSettings
    ) -> None:
        self.prompt = prompt
        self.columns = columns
        self.terms = terms
        self.settings = settings

    def reset(self, seed: int | None = None) -> Prompt:
        return [dict(message) for message in self.prompt] if isinstance(self.prompt, list) else self.prompt

    def step(self, action: str) -> Transition:
        text = action.removesuffix(self.settings.turn_stop)
        # As TRL: a conversational prompt's completion is a list of messages, a text prompt's a string.
        completion = [{"role": "assistant", "content": text}] if isinstance(self.prompt, list) else text
        scores = score_blocking(self.terms, self.prompt, completion, self.columns)
        info = {
            "success": scores.reward >= self.settings.success_reward,
            "rewards": scores.values,
            "reward_failures": list(scores.failed),
        }
        return Transition("", scores.reward, terminated=True, truncated=False, info=info)


@dataclasses.dataclass(frozen=True)
class DatasetEpisodeSettings:
    turn_stop: str
    success_reward: float


class DatasetEnv(Environment):
    """A prompt dataset with reward functions (TRL's reward-function signature; built-ins named).

    Args:
        path: a local json, jsonl, parquet or csv file, or a folder written by `save_to_disk`.
        prompt_key: the column holding each prompt: a string (the user message, through the chat template
            where the model has one) or a list of chat messages, used as they are (a chat model only).
        answer_key: the column the built-in rewards compare with.
        rewards: built-in names (`exact_match`, `math_verify`) or dotted paths to reward functions.
        reward_weights: a weight per reward function (None: 1 each).
        eval_path: a second file whose rows are the held-out ones (every row of `path` then trains).
        split_key: a column naming each row's split; rows whose value is `eval_split` are held out.
        eval_split: the held-out value of `split_key`.
        held_out_fraction: without `eval_path` or `split_key`, the share of rows held out by a hash of the prompt.
        success_reward: an answer whose reward reaches this counts as a success (`train/task_success`).
        solution_key: a column holding a good answer to each prompt: the warm start's demonstrations
            (None: no demonstrations; set `model.warm_start_steps=0`).
        max_turn_tokens: most tokens of an answer.
        turn_stop: the text that ends an answer (one token of the tokenizer; chat models stop at their
            end-of-turn token).
        latency_s, episode_timeout_s: see `Environment`.
    """

    max_turns = 1

    def __init__(
        self,
        path: str,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        rewards: Sequence[str] = ("exact_match",),
        reward_weights: Sequence[float] | None = None,
        eval_path: str | None = None,
        split_key: str | None = None,
        eval_split: str = "test",
        held_out_fraction: float = 0.2,
        success_reward: float = 1.0,
        solution_key: str | None = None,
        max_turn_tokens: int = 64,
        turn_stop: str = "\n",
        latency_s: float = 0.0,
        episode_timeout_s: float | None = None,
    ) -> None:
        super().__init__(latency_s=latency_s, episode_timeout_s=episode_timeout_s)
        if not 0 < held_out_fraction < 1:
            raise ValueError(f"env.held_out_fraction must be in (0, 1), got {held_out_fraction}")
        self.prompt_key = prompt_key
        self.verifier = MathVerifier()
        self.terms = reward_terms(list(rewards), reward_weights, answer_key, self.verifier)
        needed = {"env.prompt_key": prompt_key}
        if any(term.name in ("exact_match", "math_verify") for term in self.terms):
            needed["env.answer_key"] = answer_key
        if solution_key is not None:
            needed["env.solution_key"] = solution_key
        training = read_rows(path, "env.path")
        require_columns(training, needed | ({"env.split_key": split_key} if split_key else {}), path)
        held_out = read_rows(eval_path, "env.eval_path") if eval_path else []
        if held_out:
            require_columns(held_out, needed, eval_path)
        self.rows = training + held_out
        for index, row in enumerate(self.rows):
            if not _is_prompt(row[prompt_key]):
                raise ValueError(
                    f"env.prompt_key={prompt_key!r}: row {index} holds {row[prompt_key]!r}, neither a string nor a "
                    "list of chat messages with a role and a content each"
                )
        self.held_out_rows = frozenset(self._held_out(len(training), split_key, eval_split, held_out_fraction))
        if not self.held_out_rows or len(self.held_out_rows) == len(self.rows):
            raise ValueError(
                f"{path}: {len(self.held_out_rows)} of {len(self.rows)} rows held out; "
                "both training and held-out rows are needed (env.eval_path, env.split_key, env.held_out_fraction)"
            )
        self.held_out_fraction = held_out_fraction
        self.success_reward = success_reward
        self.solution_key = solution_key
        self.max_turn_tokens = max_turn_tokens
        self.turn_stop = turn_stop

    def _held_out(self, training: int, split_key: str | None, eval_split: str, fraction: float) -> list[int]:
        if training < len(self.rows):
            return list(range(training, len(self.rows)))
        if split_key is not None:
            return [index for index, row in enumerate(self.rows) if str(row[split_key]) == eval_split]
        prompts = [json.dumps(row[self.prompt_key], sort_keys=True) for row in self.rows]
        return [index for index, prompt in enumerate(prompts) if _hash_share(prompt) < fraction]

    def generate_instance(self, rng: random.Random) -> int:
        return rng.randrange(len(self.rows))

    def training_instances(self) -> list[int]:
        return [index for index in range(len(self.rows)) if index not in self.held_out_rows]

    def is_held_out(self, instance: int) -> bool:
        return instance in self.held_out_rows

    def instance_key(self, instance: int) -> str:
        return json.dumps(self.rows[instance], sort_keys=True, default=str)

    def new_episode(self, instance: int) -> DatasetEpisode:
        row = self.rows[instance]
        # As TRL: the prompt goes as `prompts`, every other column by its name.
        columns = {name: value for name, value in row.items() if name != self.prompt_key}
        settings = DatasetEpisodeSettings(self.turn_stop, self.success_reward)
        return DatasetEpisode(row[self.prompt_key], columns, self.terms, settings)

    def demonstration(self, instance: int) -> list[tuple[str, str]]:
        if self.solution_key is None:
            raise NotImplementedError(
                "DatasetEnv has no demonstrations without env.solution_key (a column of good answers); "
                "name one, or set model.warm_start_steps=0"
            )
        return [(f"{self.rows[instance][self.solution_key]}{self.turn_stop}", "")]

    def close(self) -> None:
        self.verifier.close()


def _is_prompt(value: Any) -> bool:
    if isinstance(value, str):
        return True
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(message, dict) and {"role", "content"} <= set(message) for message in value)
    )


def _hash_share(text: str) -> float:
    """Where `text` falls in [0, 1), the same in every run and process."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64
