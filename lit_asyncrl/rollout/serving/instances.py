"""Where a run's task instances come from, in one place: training draws (never a held-out instance)
and the held-out set, for one task or for a mixture's tasks.

A task says what its instances are and which belong to its evaluation split (`generate_instance`,
`is_held_out`, `instance_key`); this room draws them, in epochs for a task that lists its training
instances (`training_instances`, `epochs.py`). For a mixture (`TaskMix`) a training draw
first picks a task by the mixture's draw weights, which may follow the run's accounting
(`BalancedTaskMix`): the producer passes its buffer's counts at each draw, so the task holds no
state of the runner's.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from lit_asyncrl.envs.base import Environment
from lit_asyncrl.envs.mixture import MixInstance, TaskMix
from lit_asyncrl.rollout.serving.epochs import EpochOrder

#: Draws before a task is declared to have no training (or held-out) instance at all.
MAX_DRAWS = 10_000
#: Draws in a row without an instance not seen before, after which a task's instances are taken as
#: all seen: at least this many, and ten per distinct instance seen. With n instances drawn evenly
#: one stays unseen that long with chance (1 - 1/n)**max(1000, 10 n) < 5e-5: 3e-15 for the 30
#: codes of Mastermind-v0-easy, whose held-out search drew all 10,000 before.
EXHAUSTED_AFTER = 1_000


def training_instance(
    env: Environment,
    rng: random.Random,
    counts: Mapping[str, int] | None = None,
    epochs: Mapping[str | None, EpochOrder] | None = None,
) -> Any:
    """A training instance of `env` (never a held-out one). For a mixture, the task is drawn by its
    draw weights given the rollout buffer's `counts` (`RolloutBuffer.counts`; None = none yet). A task
    with an order in `epochs` (by its name in the mixture, None for a single task) deals its next one."""
    epochs = epochs or {}
    if isinstance(env, TaskMix):
        weights = env.draw_weights(counts or {})
        name = rng.choices(list(weights), weights=list(weights.values()))[0]
        own_order = {None: epochs[name]} if name in epochs else None
        return MixInstance(name, training_instance(env.tasks()[name], rng, epochs=own_order))
    if None in epochs:
        return epochs[None].next()
    for _ in range(MAX_DRAWS):
        instance = env.generate_instance(rng)
        if not env.is_held_out(instance):
            return instance
    raise RuntimeError(f"{type(env).__name__}: no training instance in {MAX_DRAWS:,} draws; lower held_out_fraction")


class TrainingDraws:
    """The training instances of a run, as every engine lane's producer draws them: a task that lists
    its training instances (a dataset's rows; a mixture's such tasks each) in epochs (`EpochOrder`),
    the others by `generate_instance` from the producer's own random generator.

    Args:
        env: the run's task (or mixture of tasks).
        seed: the run's seed, which orders every epoch.
    """

    def __init__(self, env: Environment, seed: int) -> None:
        self.env = env
        self.epochs: dict[str | None, EpochOrder] = {}
        for name, task in env.tasks().items():
            listed = task.training_instances()
            if listed is not None:
                self.epochs[name] = EpochOrder(listed, seed)

    def draw(self, rng: random.Random, counts: Mapping[str, int]) -> Any:
        """The next training instance; `counts` are the rollout buffer's."""
        return training_instance(self.env, rng, counts, self.epochs)

    def stats(self) -> dict[str, float]:
        """`rollout/epochs` (a mixture: `rollout/epochs/<task>`): the epochs dealt of each listed task."""
        return {
            "rollout/epochs" if name is None else f"rollout/epochs/{name}": order.epochs_started
            for name, order in self.epochs.items()
        }

    def state_dict(self) -> dict[str | None, dict[str, int]]:
        return {name: order.state_dict() for name, order in self.epochs.items()}

    def load_state_dict(self, state: Mapping[str | None, Mapping[str, int]]) -> None:
        for name, order in self.epochs.items():
            if name in state:
                order.load_state_dict(state[name], "env" if name is None else f"env.tasks.{name}")


def held_out_instances(env: Environment, count: int, seed: int = 0) -> list[Any]:
    """Up to `count` distinct held-out instances of `env` (fewer when its split is that small), the
    same for the same seed. A mixture shares `count` evenly over its tasks (at least one each).

    Raises:
        ValueError: when the held-out split is empty.
    """
    if isinstance(env, TaskMix):
        tasks = env.tasks()
        found = []
        for index, (name, task) in enumerate(tasks.items()):
            share = max(1, count // len(tasks) + (index < count % len(tasks)))
            found += [MixInstance(name, instance) for instance in held_out_instances(task, share, seed=seed)]
        return found
    rng = random.Random(seed)
    found = {}
    seen = set()
    last_new = 0
    for draw in range(max(MAX_DRAWS, 100 * count)):
        instance = env.generate_instance(rng)
        key = env.instance_key(instance)
        if key not in seen:
            seen.add(key)
            last_new = draw
        elif draw - last_new >= max(EXHAUSTED_AFTER, 10 * len(seen)):
            break  # every instance was drawn: the held-out split has no more to give
        if env.is_held_out(instance):
            found.setdefault(key, instance)
            if len(found) == count:
                break
    if not found:
        raise ValueError(f"{type(env).__name__} has no held-out instance; raise its held_out_fraction")
    return list(found.values())
