"""The environment protocol: text agents in the style of gymnasium, one task family per class.

Two levels, as in gymnasium's `make` and `Env`:

- `Environment` is a task family (a config object the CLI and Hydra build): it draws task
  instances, splits them into training and held-out ones, and makes one `TextEnv` per episode.
- `TextEnv` is one episode: `reset(seed) -> observation` and
  `step(action) -> (observation, reward, terminated, truncated, info)`. Either method may be
  `async def` (awaited on the engine's event loop, e.g. a tool that calls a service); a plain
  method runs in a thread pool sized to the concurrent episodes, so a slow tool never stalls
  generation. `info["success"]` marks a solved task (avg@k and pass@k count it). An episode may
  also have `cut_off(reason)` (sync or async): the runner calls it when it stops the episode before
  the task ended it (`"context"` full, `"turns"` used up, `"timeout"`) and adds the Transition it
  answers (its reward and success; None adds nothing), so a task can grade a cut-off play.

Every environment takes `latency_s` (simulated latency added to each of its answers; the episode
sleeps without holding a worker) and `episode_timeout_s` (an episode that runs longer ends as
truncated and is counted).
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import inspect
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol

from lit_asyncrl.envs.resources import EngineMaker


class Transition(NamedTuple):
    """What the environment answers to one agent turn (unpacks like gymnasium's step tuple)."""

    observation: str  # text appended to the context (never trained on)
    reward: float
    terminated: bool  # the task ended (solved, failed, or broken by a malformed action)
    truncated: bool  # the episode was cut short (turn limit, timeout) without the task ending
    info: dict[str, Any] = {}  # shared default: never mutate a Transition's info in place

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    @property
    def success(self) -> bool:
        return bool(self.info.get("success", False))


class TaskInstance(NamedTuple):
    """Which task plays an instance: its name in a mixture (None for a single task), the task's
    environment and the instance as that environment knows it."""

    name: str | None
    env: Environment
    instance: Any


class TextEnv(Protocol):
    """One episode of a task instance. `reset` and `step` may each be sync or `async def`."""

    def reset(self, seed: int | None = None) -> str | Awaitable[str]: ...

    def step(self, action: str) -> Transition | Awaitable[Transition]: ...


class Environment(abc.ABC):
    """A family of task instances; subclass it for a new task.

    Episodes of the same instance form one advantage group. A base class rather than a Protocol,
    so the Lightning CLI can take any subclass as `class_path` + `init_args`.

    Held-out instances: `is_held_out` splits the instance space for good (by default a stable hash
    of `instance_key` sends `held_out_fraction` of the instances to evaluation); the runner draws
    training instances outside that split and evaluation ones inside it
    (`lit_asyncrl.rollout.serving.instances`), so evaluation measures generalisation to instances never
    trained on, not only to unseen seeds.

    Args:
        latency_s: seconds of simulated latency added to every answer of the environment
            (reset and each step), e.g. a slow tool or a simulated user.
        episode_timeout_s: an episode running longer than this ends as truncated with the reward
            it has so far (counted as `rollout/timed_out_episodes`); None = no limit.
    """

    #: Text that ends an agent turn (must be a single token; the engine stops sampling at it).
    turn_stop: str = ";"
    #: Most tokens the agent may write in one turn.
    max_turn_tokens: int = 16
    #: Most agent turns in one episode (a hard cap on top of the environment's own truncation).
    max_turns: int = 1
    #: Share of the instance space kept for evaluation by the default `is_held_out`.
    held_out_fraction: float = 0.2
    #: Chat-template models only: instructions sent as the system message (raw-text policies,
    #: like the built-in tiny one, read only the observations).
    system_prompt: str | None = None
    #: Chat-template models only: the role of the environment's answers after an agent turn,
    #: "user" (a simulated user) or "tool" (a tool result; "user" where the template has no tool role).
    observation_role: str = "user"

    def __init__(self, latency_s: float = 0.0, episode_timeout_s: float | None = None) -> None:
        if latency_s < 0:
            raise ValueError(f"env.latency_s must be >= 0, got {latency_s}")
        if episode_timeout_s is not None and episode_timeout_s <= 0:
            raise ValueError(f"env.episode_timeout_s must be > 0 or null, got {episode_timeout_s}")
        self.latency_s = float(latency_s)
        self.episode_timeout_s = episode_timeout_s

    @abc.abstractmethod
    def generate_instance(self, rng: random.Random) -> Any:
        """Draw a task instance (a secret, a database and a request, a seed), training or held out."""

    @abc.abstractmethod
    def new_episode(self, instance: Any) -> TextEnv:
        """A fresh episode of `instance`."""

    def turn_limit(self, instance: Any) -> int:
        """Most agent turns in an episode of `instance` (`max_turns` by default; a task whose instances
        need different lengths, like conversations of several requests, says so here)."""
        return self.max_turns

    def observation_role_of(self, observation: str) -> str:
        """Chat-template models only: the role of one answer after an agent turn (by default
        `observation_role`; a task that relays both a user and tools tells them apart here)."""
        return self.observation_role

    def start(self, make_engine: EngineMaker | None = None) -> None:
        """Make what the task's episodes share for a run (e.g. a simulated user's engine, started with
        `make_engine`); no-op by default. The rollout service calls it before the first episode,
        with its own `make_engine`, and `close` on every way out."""
        return None

    def close(self) -> None:
        """Free what `start` made; safe to call twice and without `start` (no-op by default)."""
        return None

    def tasks(self) -> dict[str | None, Environment]:
        """The task families this environment plays, by name: itself alone (under None) by default;
        a mixture of tasks (`TaskMix`) names each of its tasks."""
        return {None: self}

    def task_of(self, instance: Any) -> TaskInstance:
        """The task that plays `instance`. The episode runner plays each instance with its task's own
        settings (turn stop, turn limits, chat roles, latency), so a mixture's tasks keep theirs."""
        return TaskInstance(None, self, instance)

    def instance_key(self, instance: Any) -> str:
        """A stable text identifying the instance (two equal keys are the same task)."""
        return repr(instance)

    def is_held_out(self, instance: Any) -> bool:
        """Whether `instance` belongs to the evaluation split (stable across runs and processes)."""
        digest = hashlib.sha256(self.instance_key(instance).encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < self.held_out_fraction

    def training_instances(self) -> Sequence[Any] | None:
        """Every training instance, for a task that has a fixed list of them (a dataset's rows); None
        (the default) for a task whose instances are drawn by `generate_instance`.

        A run plays a listed task in epochs: each a pass over the list in an order shuffled by the
        run's seed, continued where it was by a resumed run (`lit_asyncrl.rollout.serving.epochs`).
        """
        return None

    def demonstration(self, instance: Any) -> list[tuple[str, str]]:
        """A scripted good play as (agent action, environment observation) pairs, for warm starts."""
        raise NotImplementedError(f"{type(self).__name__} has no scripted demonstrations; set warm_start_steps=0")


def call_blocking(method: Callable[..., Any], *args: Any) -> Any:
    """Run an environment method to completion outside any event loop (warm start, tests)."""
    result = method(*args)
    return asyncio.run(result) if inspect.iscoroutine(result) else result
