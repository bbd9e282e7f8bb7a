"""Where a run's task instances come from, in one place: training draws (never a held-out instance)
and the held-out set, for one task or for a mixture's tasks.

A task says what its instances are and which belong to its evaluation split (`generate_instance`,
`is_held_out`, `instance_key`); this room draws them. For a mixture (`TaskMix`) a training draw
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

#: Draws before a task is declared to have no training (or held-out) instance at all.
MAX_DRAWS = 10_000
#: Draws in a row without an instance not seen before, after which a task's instances are taken as
#: all seen: at least this many, and ten per distinct instance seen. With n instances drawn evenly
#: one stays unseen that long with chance (1 - 1/n)**max(1000, 10 n) < 5e-5: 3e-15 for the 30
#: codes of Mastermind-v0-easy, whose held-out search drew all 10,000 before.
EXHAUSTED_AFTER = 1_000


def training_instance(env: Environment, rng: random.Random, counts: Mapping[str, int] | None = None) -> Any:
    """A training instance of `env` (never a held-out one). For a mixture, the task is drawn by its
    draw weights given the rollout buffer's `counts` (`RolloutBuffer.counts`; None = none yet)."""
    if isinstance(env, TaskMix):
        weights = env.draw_weights(counts or {})
        name = rng.choices(list(weights), weights=list(weights.values()))[0]
        return MixInstance(name, training_instance(env.tasks()[name], rng))
    for _ in range(MAX_DRAWS):
        instance = env.generate_instance(rng)
        if not env.is_held_out(instance):
            return instance
    raise RuntimeError(f"{type(env).__name__}: no training instance in {MAX_DRAWS:,} draws; lower held_out_fraction")


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
