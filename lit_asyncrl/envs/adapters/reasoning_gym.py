"""reasoning-gym tasks as a single-turn `Environment`: `env=reasoning_gym env.task=basic_arithmetic`.

Needs the `reasoning-gym` extra (`pip install -e ".[reasoning-gym]"`); selecting it without the
extra fails in `__init__` with an error naming the extra. The module itself imports without it.

Instances are entry indices into `reasoning_gym.create_dataset(task, size=size, seed=seed, **config)`
(entries are generated on first use and cached). The held-out split is by question text: the key is
the task name and the question, so an evaluation question is never trained on, even when the
dataset repeats it under another index.

One turn: the prompt is the entry's question (`prompt` template, default the question and a
newline); the agent writes its answer and `turn_stop` (default a newline). The answer is the
content of the last `\\boxed{...}` in the turn if there is one (gem's convention), else the turn
without `turn_stop`, stripped of surrounding whitespace (`answer_format="text"`), or the last number
in the turn (`answer_format="last_number"`, for chat models that explain before they answer:
"4 + 6 = 10" answers 10). The task's own scorer grades it:
reward = `dataset.score_answer(answer, entry)` (0..1; a scorer that raises on a malformed answer
scores 0), success = a score of 1. `demonstration` writes the entry's answer (the warm start).

Characters: the questions and answers of some tasks hold characters outside printable ASCII and the
newline, which the built-in character tokenizer cannot encode (among them complex_arithmetic
`×÷`, prime_factorization `×`, advanced_geometry / simple_geometry `°`, propositional_logic,
circuit_logic, futoshiki, quantum_lock, sentence_reordering, gsm_symbolic, emoji_mystery); the small
arithmetic tasks (basic_arithmetic, chain_sum, leg_counting, gcd, lcm, ...) do not. `ascii_only=True`
keeps only entries whose question and answer are printable ASCII and newlines. Some tasks' answers
span lines (mini_sudoku, n_queens, rotate_matrix, ...): give them a `turn_stop` other than the
newline, e.g. `}` with `\\boxed{...}` answers.

Thread safety: every call into reasoning-gym holds one process-wide lock and runs in the episode's
own copy of the global `random` / `numpy.random` state (`lit_asyncrl.envs.adapters.global_rng`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from lit_asyncrl.envs.adapters.global_rng import GlobalRandomState
from lit_asyncrl.envs.base import Environment, Transition
from lit_asyncrl.models.char_tokenizer import CHARACTERS

#: Characters the built-in character tokenizer encodes: printable ASCII and the newline.
PRINTABLE = frozenset(CHARACTERS)


def import_reasoning_gym() -> Any:
    """The `reasoning_gym` package, or an ImportError naming the extra that installs it."""
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError(
            "env=reasoning_gym needs the 'reasoning-gym' extra: pip install -e \".[reasoning-gym]\""
        ) from error
    return reasoning_gym


ANSWER_FORMATS = ("text", "last_number")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_answer(action: str, turn_stop: str, answer_format: str = "text") -> str:
    """The last `\\boxed{...}` content of `action` if any, else `action` without `turn_stop`
    ("text") or its last number ("last_number", empty when there is none); stripped."""
    boxed = _last_boxed(action)
    if boxed is not None:
        return boxed.strip()
    if answer_format == "last_number":
        numbers = _NUMBER.findall(action)
        return numbers[-1] if numbers else ""
    return action.removesuffix(turn_stop).strip()


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for position in range(start + len("\\boxed"), len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if depth == 0:
            return text[start + len("\\boxed{") : position]
    return None


class ReasoningGymEpisode:
    """One answer to one entry."""

    def __init__(self, owner: ReasoningGymEnv, index: int) -> None:
        self.owner = owner
        self.index = index
        self.rng_state = GlobalRandomState(index)

    def reset(self, seed: int | None = None) -> str:
        """The prompt. `seed` is ignored: the instance is the entry."""
        return self.owner.prompt(self.index)

    def step(self, action: str) -> Transition:
        answer = extract_answer(action, self.owner.turn_stop, self.owner.answer_format)
        entry = self.owner.entry(self.index)
        info: dict[str, Any] = {"answer": answer}
        with self.rng_state.active():
            try:
                score = float(self.owner.dataset.score_answer(answer, entry))
            except Exception as error:  # a scorer that chokes on a malformed answer: wrong
                score = 0.0
                info["score_error"] = repr(error)
        info.update(score=score, success=score == 1.0)
        return Transition("", score, terminated=True, truncated=False, info=info)


class ReasoningGymEnv(Environment):
    """A reasoning-gym task; see the module docstring for instances, scoring and characters.

    Args:
        task: a reasoning-gym dataset name (`reasoning_gym.factory.DATASETS`), e.g.
            basic_arithmetic, chain_sum, leg_counting, gcd, number_sorting, spell_backward.
        size: entries in the dataset (training and held-out together).
        seed: the dataset's seed.
        config: the task's own settings, passed to `create_dataset` (e.g. `{min_terms: 2}`).
        prompt: template of the prompt; `{question}` is the question without trailing newlines.
        system_prompt: chat-template models only: the system message (e.g. "Reply with the
            final answer only."); None = the template's default.
        turn_stop: the text that ends the answer (one token of the policy's tokenizer).
        answer_format: "text" (the whole turn is the answer) or "last_number" (its last number).
        max_turn_tokens: most tokens in the answer.
        ascii_only: keep only entries whose question and answer are printable ASCII and newlines.
        held_out_fraction: share of the questions kept for evaluation.
        latency_s, episode_timeout_s: see `Environment`.
    """

    max_turns = 1

    def __init__(
        self,
        task: str = "basic_arithmetic",
        size: int = 1000,
        seed: int = 42,
        config: Mapping[str, Any] | None = None,
        prompt: str = "{question}\n",
        system_prompt: str | None = None,
        turn_stop: str = "\n",
        answer_format: str = "text",
        max_turn_tokens: int = 32,
        ascii_only: bool = False,
        held_out_fraction: float = 0.2,
        latency_s: float = 0.0,
        episode_timeout_s: float | None = None,
    ) -> None:
        super().__init__(latency_s=latency_s, episode_timeout_s=episode_timeout_s)
        reasoning_gym = import_reasoning_gym()  # first: a missing extra fails before any work
        if task not in reasoning_gym.factory.DATASETS:
            raise ValueError(
                f"env.task={task!r} is not a reasoning-gym task; "
                f"tasks: {', '.join(sorted(reasoning_gym.factory.DATASETS))}"
            )
        if size < 1:
            raise ValueError(f"env.size must be >= 1, got {size}")
        if not isinstance(turn_stop, str) or not turn_stop:
            raise ValueError(f"env.turn_stop must be a non-empty string, got {turn_stop!r}")
        if answer_format not in ANSWER_FORMATS:
            raise ValueError(f"env.answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}")
        if max_turn_tokens < 1:
            raise ValueError(f"env.max_turn_tokens must be >= 1, got {max_turn_tokens}")
        if not 0.0 < held_out_fraction < 1.0:
            raise ValueError(f"env.held_out_fraction must be in (0, 1), got {held_out_fraction}")
        if "{question}" not in prompt:
            raise ValueError(f"env.prompt must contain {{question}}, got {prompt!r}")
        self.task = task
        self.size = int(size)
        self.seed = int(seed)
        self.config = dict(config or {})
        self.prompt_template = prompt
        self.system_prompt = system_prompt
        self.turn_stop = turn_stop
        self.answer_format = answer_format
        self.max_turn_tokens = int(max_turn_tokens)
        self.ascii_only = bool(ascii_only)
        self.held_out_fraction = float(held_out_fraction)
        with GlobalRandomState(self.seed).active():
            try:
                self.dataset = reasoning_gym.create_dataset(task, size=self.size, seed=self.seed, **self.config)
            except (TypeError, ValueError, AssertionError) as error:
                raise ValueError(
                    f"env.config={self.config} does not fit reasoning-gym task {task!r}: {error}"
                ) from error
        self._entries: dict[int, dict[str, Any]] = {}

    def entry(self, index: int) -> dict[str, Any]:
        """Entry `index` of the dataset (question, answer, metadata), generated once."""
        entry = self._entries.get(index)
        if entry is None:
            with GlobalRandomState(self.seed + index).active():
                entry = self._entries.setdefault(index, self.dataset[index])
        return entry

    def prompt(self, index: int) -> str:
        return self.prompt_template.format(question=self.entry(index)["question"].rstrip("\n"))

    def _printable(self, index: int) -> bool:
        entry = self.entry(index)
        return set(self.prompt(index)) <= PRINTABLE and set(str(entry["answer"])) <= PRINTABLE

    def generate_instance(self, rng: random.Random) -> int:
        for _ in range(1000):
            index = rng.randrange(self.size)
            if not self.ascii_only or self._printable(index):
                return index
        raise ValueError(
            f"env.ascii_only: no entry of {self.task!r} in 1000 draws is printable ASCII; set env.ascii_only=false"
        )

    def new_episode(self, instance: int) -> ReasoningGymEpisode:
        return ReasoningGymEpisode(self, int(instance))

    def instance_key(self, instance: int) -> str:
        return f"{self.task}: {self.entry(int(instance))['question']}"

    def demonstration(self, instance: int) -> list[tuple[str, str]]:
        """The entry's own answer and `turn_stop`.

        Raises:
            ValueError: when the answer holds `turn_stop` or the task's scorer does not give it 1.
        """
        entry = self.entry(int(instance))
        answer = str(entry["answer"])
        if self.turn_stop in answer:
            raise ValueError(
                f"{self.task} answer {answer!r} holds env.turn_stop={self.turn_stop!r}; pick another turn_stop"
            )
        result = self.new_episode(instance).step(answer + self.turn_stop)
        if not result.success:
            raise ValueError(
                f"{self.task}: its scorer gives its own answer {answer!r} {result.reward}; no demonstration"
            )
        return [(answer + self.turn_stop, result.observation)]
