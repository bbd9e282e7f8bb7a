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

from lit_asyncrl.envs.base import Environment
from lit_asyncrl.envs.guess_number import GuessNumberEpisode, require_at_least, some_not_all

#: An instance: the first number of the range and the secret.
RangeInstance = tuple[int, int]


class RangeGuessEpisode(GuessNumberEpisode):
    """Guess-the-number's episode, telling the range still possible instead of higher or lower."""

    def __init__(self, instance: RangeInstance, span: int, max_turns: int, malformed_reward: float) -> None:
        start, secret = instance
        super().__init__(secret, start + span - 1, max_turns, malformed_reward)
        self.low = start
        self.high = start + span - 1

    def reset(self, seed: int | None = None) -> str:
        return self.shown_range()

    def answer(self, wrong_guess: int) -> str:
        # A guess outside the range shown teaches nothing new: the range stays.
        if self.secret > wrong_guess:
            self.low = max(self.low, wrong_guess + 1)
        else:
            self.high = min(self.high, wrong_guess - 1)
        return self.shown_range()

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
        require_at_least("env.span", span, 2)
        require_at_least("env.max_start", max_start, 2)
        require_at_least("env.max_turns", max_turns, 1)
        self.held_out = some_not_all(held_out, max_start, "starts")
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
