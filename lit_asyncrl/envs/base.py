"""The environment protocol: a multi-turn text task the agent plays one turn at a time."""

from __future__ import annotations

import dataclasses
import random
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What the environment answers to one agent turn."""

    observation: str  # text appended to the context (never trained on)
    reward: float
    done: bool
    success: bool = False


class Episode(Protocol):
    """One play of a task instance: `reset` gives the first observation, `step` answers each turn."""

    def reset(self) -> str: ...

    def step(self, action: str) -> StepResult: ...


class Environment(Protocol):
    """A family of task instances. Episodes of the same instance form one advantage group."""

    #: Text that ends an agent turn (the engine stops sampling at it).
    turn_stop: str
    #: Most tokens the agent may write in one turn.
    max_turn_tokens: int
    #: Most agent turns in one episode.
    max_turns: int

    def sample_instance(self, rng: random.Random) -> object: ...

    def new_episode(self, instance: object) -> Episode: ...

    def demonstration(self, instance: object) -> list[tuple[str, str]]:
        """A scripted good play as (agent action, environment observation) pairs, for warm starts."""
        ...
