"""Guess-the-number with higher/lower feedback: the built-in multi-turn task.

The secret is in 1..N. Each turn the agent writes a number and `;`; the environment answers `H`
(the secret is higher), `L` (lower) or `W` (found, reward 1). After `max_turns` wrong guesses the
episode ends with reward 0; a malformed guess ends it at once with `malformed_reward`. A policy that
ignores the feedback wins at most max_turns/N (0.4 at the default N=10, 4 turns); bisection wins
always, so learning shows as success rising past that line.
"""

from __future__ import annotations

import random

from lit_asyncrl.envs.base import Environment, StepResult


class GuessNumberEpisode:
    def __init__(self, secret: int, max_value: int, max_turns: int, malformed_reward: float) -> None:
        self.secret = secret
        self.max_value = max_value
        self.turns_left = max_turns
        self.malformed_reward = malformed_reward

    def reset(self) -> str:
        return "?"

    def step(self, action: str) -> StepResult:
        guess = _parse_guess(action)
        if guess is None:
            return StepResult(observation="", reward=self.malformed_reward, done=True)
        self.turns_left -= 1
        if guess == self.secret:
            return StepResult(observation="W", reward=1.0, done=True, success=True)
        feedback = "H" if self.secret > guess else "L"
        return StepResult(observation=feedback, reward=0.0, done=self.turns_left <= 0)


class GuessNumberEnv(Environment):
    """Task instances are secrets; `demonstration` plays bisection (used by the warm start)."""

    turn_stop = ";"

    def __init__(self, max_value: int = 10, max_turns: int = 4, malformed_reward: float = -0.2) -> None:
        if max_value < 2:
            raise ValueError(f"env.max_value must be >= 2, got {max_value}")
        if max_turns < 1:
            raise ValueError(f"env.max_turns must be >= 1, got {max_turns}")
        self.max_value = max_value
        self.max_turns = max_turns
        self.malformed_reward = malformed_reward
        self.max_turn_tokens = len(str(max_value)) + 1  # digits and the `;`

    def sample_instance(self, rng: random.Random) -> int:
        return rng.randint(1, self.max_value)

    def new_episode(self, instance: int) -> GuessNumberEpisode:
        return GuessNumberEpisode(instance, self.max_value, self.max_turns, self.malformed_reward)

    def demonstration(self, instance: int) -> list[tuple[str, str]]:
        low, high, turns = 1, self.max_value, []
        while len(turns) < self.max_turns:
            guess = (low + high) // 2
            if guess == instance:
                turns.append((f"{guess};", "W"))
                break
            turns.append((f"{guess};", "H" if instance > guess else "L"))
            low, high = (guess + 1, high) if instance > guess else (low, guess - 1)
        return turns


def _parse_guess(action: str) -> int | None:
    digits = action.removesuffix(";")
    if not action.endswith(";") or not digits.isdigit() or digits.startswith("0"):
        return None
    return int(digits)
