"""The environment protocol: a multi-turn text task the agent plays one turn at a time."""

from __future__ import annotations

import abc
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


class Environment(abc.ABC):
    """A family of task instances; subclass it for a new task.

    Episodes of the same instance form one advantage group. A base class rather than a Protocol,
    so the Lightning CLI can take any subclass as `class_path` + `init_args`.
    """

    #: Text that ends an agent turn (must be a single token; the engine stops sampling at it).
    turn_stop: str = ";"
    #: Most tokens the agent may write in one turn.
    max_turn_tokens: int = 16
    #: Most agent turns in one episode.
    max_turns: int = 1

    @abc.abstractmethod
    def sample_instance(self, rng: random.Random) -> object:
        """Draw a task instance (e.g. a secret, a prompt)."""

    @abc.abstractmethod
    def new_episode(self, instance: object) -> Episode:
        """Start one play of `instance`."""

    def demonstration(self, instance: object) -> list[tuple[str, str]]:
        """A scripted good play as (agent action, environment observation) pairs, for warm starts."""
        raise NotImplementedError(f"{type(self).__name__} has no scripted demonstrations; set warm_start_steps=0")
