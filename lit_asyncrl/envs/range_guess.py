"""Guess a number in a range that moves from instance to instance: the default task.

An instance is a range of `span` consecutive numbers starting at `start` (1..max_start) and a secret
in it. The agent is shown the range (`11-20?`) and writes a number and `;`; the environment answers
with the range the secret is still in (`16-20?`), or `W` when the guess is the secret (reward 1).
After `max_turns` wrong guesses the episode ends with reward 0; a malformed guess ends it at once with
`malformed_reward`. Guessing the middle of the range shown wins every instance within 4 turns at
span 10; a guess at random in the starting range wins about a third.

The ranges starting at `held_out` are never trained on: evaluation plays them. A policy that learned
to search (guess inside the range it is shown, near its middle) solves them; one that memorised the
training instances does not: replaying the winning guesses of a training instance, whatever the
answers, solves 22% of the held-out instances at the defaults (`tests/envs/test_range_guess.py`).
With one fixed range (guess-the-number, `GuessNumberEnv`) no such split exists: its held-out secrets
are solved only by a policy whose guesses happen to pass through them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from lit_asyncrl.envs.base import Environment, Transition
from lit_asyncrl.envs.guess_number import parse_guess

#: An instance: the first number of the range and the secret.
RangeInstance = tuple[int, int]


class RangeGuessEpisode:
    def __init__(self, instance: RangeInstance, span: int, max_turns: int, malformed_reward: float) -> None:
        start, self.secret = instance
        self.low = start
        self.high = start + span - 1
        self.turns_left = max_turns
        self.malformed_reward = malformed_reward

    def reset(self, seed: int | None = None) -> str:
        return self.shown_range()

    def step(self, action: str) -> Transition:
        guess = parse_guess(action)
        if guess is None:
            return Transition("", self.malformed_reward, terminated=True, truncated=False, info={"malformed": True})
        self.turns_left -= 1
        if guess == self.secret:
            return Transition("W", 1.0, terminated=True, truncated=False, info={"success": True})
        # A guess outside the range shown teaches nothing new: the range stays.
        if self.secret > guess:
            self.low = max(self.low, guess + 1)
        else:
            self.high = min(self.high, guess - 1)
        return Transition(self.shown_range(), 0.0, terminated=False, truncated=self.turns_left <= 0)

    def shown_range(self) -> str:
        return f"{self.low}-{self.high}?"


class RangeGuessEnv(Environment):
    """Task instances are (start, secret); `demonstration` guesses the middle of the range shown.

    Args:
        span: numbers per range.
        max_start: ranges start at 1..max_start.
        max_turns: guesses per episode.
        malformed_reward: reward of a guess that is not a number and `;` (ends the episode).
        held_out: range starts kept for evaluation, never drawn for training.
        latency_s, episode_timeout_s: see `Environment`.
    """

    turn_stop = ";"

    def __init__(
        self,
        span: int = 10,
        max_start: int = 10,
        max_turns: int = 4,
        malformed_reward: float = -0.2,
        held_out: Sequence[int] = (6,),
        latency_s: float = 0.0,
        episode_timeout_s: float | None = None,
    ) -> None:
        super().__init__(latency_s=latency_s, episode_timeout_s=episode_timeout_s)
        if span < 2:
            raise ValueError(f"env.span must be >= 2, got {span}")
        if max_start < 2:
            raise ValueError(f"env.max_start must be >= 2, got {max_start}")
        if max_turns < 1:
            raise ValueError(f"env.max_turns must be >= 1, got {max_turns}")
        self.held_out = frozenset(int(start) for start in held_out)
        if not self.held_out <= set(range(1, max_start + 1)) or len(self.held_out) >= max_start:
            raise ValueError(
                f"env.held_out={sorted(self.held_out)} must be some, not all, of the starts 1..{max_start}"
            )
        self.span = span
        self.max_start = max_start
        self.max_turns = max_turns
        self.malformed_reward = malformed_reward
        self.max_turn_tokens = len(str(max_start + span - 1)) + 1  # digits and the `;`

    def generate_instance(self, rng: random.Random) -> RangeInstance:
        start = rng.randint(1, self.max_start)
        return (start, rng.randint(start, start + self.span - 1))

    def is_held_out(self, instance: RangeInstance) -> bool:
        return instance[0] in self.held_out

    def new_episode(self, instance: RangeInstance) -> RangeGuessEpisode:
        start, secret = instance
        return RangeGuessEpisode((start, secret), self.span, self.max_turns, self.malformed_reward)

    def demonstration(self, instance: RangeInstance) -> list[tuple[str, str]]:
        episode = self.new_episode(instance)
        turns = []
        while len(turns) < self.max_turns:
            guess = f"{(episode.low + episode.high) // 2};"
            transition = episode.step(guess)
            turns.append((guess, transition.observation))
            if transition.terminated:
                break
        return turns
