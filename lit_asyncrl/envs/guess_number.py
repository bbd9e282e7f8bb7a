"""Guess-the-number with higher/lower feedback: the built-in multi-turn task.

The secret is in 1..N. Each turn the agent writes a number and `;`; the environment answers `H`
(the secret is higher), `L` (lower) or `W` (found, reward 1). After `max_turns` wrong guesses the
episode ends with reward 0; a malformed guess ends it at once with `malformed_reward`. A policy that
ignores the feedback wins at most max_turns/N (0.4 at the default N=10, 4 turns); bisection wins
always, so learning shows as success rising past that line. The secrets in `held_out` are never
trained on; evaluation plays them. What that measures is narrow: the secret is never shown, so a
policy is a fixed tree of guesses, and any tree that wins the training secrets wins as often without
ever guessing a held-out one (RL drifts to such trees: measured, held-out avg@4 0.31 -> 0.50 with
one held-out secret won always, the other never). `RangeGuessEnv`, the default task, moves the range
from instance to instance, so that its held-out instances take a search to solve.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from lit_asyncrl.envs.base import Environment, Transition


class GuessNumberEpisode:
    def __init__(self, secret: int, max_value: int, max_turns: int, malformed_reward: float) -> None:
        self.secret = secret
        self.max_value = max_value
        self.turns_left = max_turns
        self.malformed_reward = malformed_reward

    def reset(self, seed: int | None = None) -> str:
        return "?"

    def step(self, action: str) -> Transition:
        guess = parse_guess(action)
        if guess is None:
            return Transition("", self.malformed_reward, terminated=True, truncated=False, info={"malformed": True})
        self.turns_left -= 1
        if guess == self.secret:
            return Transition("W", 1.0, terminated=True, truncated=False, info={"success": True})
        return Transition(self.answer(guess), 0.0, terminated=False, truncated=self.turns_left <= 0)

    def answer(self, wrong_guess: int) -> str:
        """What the agent is told after a wrong guess: the secret is higher or lower."""
        return "H" if self.secret > wrong_guess else "L"


class GuessNumberEnv(Environment):
    """Task instances are secrets; `demonstration` plays bisection (used by the warm start).

    Args:
        max_value: secrets are 1..max_value.
        max_turns: guesses per episode.
        malformed_reward: reward of a guess that is not a number and `;` (ends the episode).
        held_out: secrets kept for evaluation, never drawn for training.
        latency_s, episode_timeout_s: see `Environment`.
    """

    turn_stop = ";"

    def __init__(
        self,
        max_value: int = 10,
        max_turns: int = 4,
        malformed_reward: float = -0.2,
        held_out: Sequence[int] = (3, 8),
        latency_s: float = 0.0,
        episode_timeout_s: float | None = None,
    ) -> None:
        super().__init__(latency_s=latency_s, episode_timeout_s=episode_timeout_s)
        require_at_least("env.max_value", max_value, 2)
        require_at_least("env.max_turns", max_turns, 1)
        self.held_out = some_not_all(held_out, max_value, "secrets")
        self.max_value = max_value
        self.max_turns = max_turns
        self.malformed_reward = malformed_reward
        self.max_turn_tokens = len(str(max_value)) + 1  # digits and the `;`

    def generate_instance(self, rng: random.Random) -> int:
        return rng.randint(1, self.max_value)

    def is_held_out(self, instance: int) -> bool:
        return instance in self.held_out

    def new_episode(self, instance: int) -> GuessNumberEpisode:
        return GuessNumberEpisode(instance, self.max_value, self.max_turns, self.malformed_reward)

    def demonstration(self, instance: int) -> list[tuple[str, str]]:
        low = 1
        high = self.max_value
        turns = []
        while len(turns) < self.max_turns:
            guess = (low + high) // 2
            if guess == instance:
                turns.append((f"{guess};", "W"))
                break
            turns.append((f"{guess};", "H" if instance > guess else "L"))
            low, high = (guess + 1, high) if instance > guess else (low, guess - 1)
        return turns


def require_at_least(key: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ValueError(f"{key} must be >= {minimum}, got {value}")


def some_not_all(held_out: Sequence[int], largest: int, what: str) -> frozenset[int]:
    """`env.held_out` as a set, refused unless it is some, not all, of 1..largest (`what` names them)."""
    chosen = frozenset(int(item) for item in held_out)
    if not chosen <= set(range(1, largest + 1)) or len(chosen) >= largest:
        raise ValueError(f"env.held_out={sorted(chosen)} must be some, not all, of the {what} 1..{largest}")
    return chosen


def parse_guess(action: str) -> int | None:
    digits = action.removesuffix(";")
    if not action.endswith(";") or not digits.isdigit() or digits.startswith("0"):
        return None
    return int(digits)
