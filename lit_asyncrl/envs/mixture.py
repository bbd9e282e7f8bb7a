"""A mixture of tasks: one run trains on several task families and evaluates each on its own.

The paper trains on a corpus spanning several agentic environments and reports held-out success
per domain (tau2-bench's retail, airline and telecom side by side). `TaskMix` is that setting: each
training group is an instance of one task, drawn by weight; each task keeps its own held-out split,
its own turn settings and chat roles (the episode runner asks `task_of` which task plays an
instance), and the module logs avg@k / pass@k per task (`val/<task>/avg@k`) beside the overall ones.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from lit_asyncrl.envs.base import Environment, TaskInstance, TextEnv
from lit_asyncrl.envs.resources import EngineMaker

#: Task names become metric keys (`val/<name>/avg@4`): lower-case words only.
_TASK_NAME = re.compile(r"[a-z][a-z0-9_]*")


class MixInstance(NamedTuple):
    """An instance of a mixture: the task's name and the task's own instance."""

    task: str
    instance: Any


class TaskMix(Environment):
    """Several task families in one run, each instance played by its own task.

    Args:
        tasks: the tasks by name (`{retail: ServiceDeskEnv(...), game: GuessNumberEnv(...)}`); a
            name is a metric key, so lower-case letters, digits and `_`. Each task keeps its own
            `latency_s`, `episode_timeout_s`, turn settings and held-out split.
        weights: how often each task's instances are drawn for training, relative to each other
            (a task left out weighs 1); None = every task equally often.
    """

    def __init__(self, tasks: Mapping[str, Environment], weights: Mapping[str, float] | None = None) -> None:
        super().__init__()
        if not isinstance(tasks, Mapping) or not tasks:
            raise ValueError(f"env.tasks must name at least one task (a mapping of name to environment), got {tasks!r}")
        for name, task in tasks.items():
            if not isinstance(name, str) or not _TASK_NAME.fullmatch(name):
                raise ValueError(
                    f"env.tasks: the task name {name!r} must be lower-case letters, digits and '_' (it names metrics)"
                )
            if not isinstance(task, Environment):
                raise ValueError(f"env.tasks.{name} must be an Environment, got {type(task).__name__}")
            if isinstance(task, TaskMix):
                raise ValueError(f"env.tasks.{name} is a TaskMix itself: list its tasks in this one instead")
        weights = dict(weights or {})
        for name, weight in weights.items():
            if name not in tasks:
                raise ValueError(f"env.weights.{name}: no such task (tasks: {', '.join(tasks)})")
            if (
                isinstance(weight, bool)
                or not isinstance(weight, (int, float))
                or not (math.isfinite(weight) and weight > 0)
            ):
                raise ValueError(f"env.weights.{name} must be a number > 0, got {weight!r}")
        self._tasks = dict(tasks)
        self._names = list(self._tasks)
        self._weights = [float(weights.get(name, 1.0)) for name in self._names]

    def tasks(self) -> dict[str, Environment]:
        return dict(self._tasks)

    def draw_weights(self, counts: Mapping[str, int]) -> dict[str, float]:
        """How often each task is drawn for training next, by name, given the run's accounting so far
        (`RolloutBuffer.counts`, passed in by the producer's draws): the weights themselves here."""
        return dict(zip(self._names, self._weights))

    def task_of(self, instance: MixInstance) -> TaskInstance:
        return TaskInstance(instance.task, self._tasks[instance.task], instance.instance)

    def generate_instance(self, rng: random.Random) -> MixInstance:
        name = rng.choices(self._names, weights=self._weights)[0]
        return MixInstance(name, self._tasks[name].generate_instance(rng))

    def is_held_out(self, instance: MixInstance) -> bool:
        return self._tasks[instance.task].is_held_out(instance.instance)

    def instance_key(self, instance: MixInstance) -> str:
        return f"{instance.task}/{self._tasks[instance.task].instance_key(instance.instance)}"

    def new_episode(self, instance: MixInstance) -> TextEnv:
        return self._tasks[instance.task].new_episode(instance.instance)

    def demonstration(self, instance: MixInstance) -> list[tuple[str, str]]:
        return self._tasks[instance.task].demonstration(instance.instance)

    def start(self, make_engine: EngineMaker | None = None) -> None:
        started = []
        try:
            for task in self._tasks.values():
                task.start(make_engine)
                started.append(task)
        except BaseException:
            for task in reversed(started):
                task.close()
            raise

    def close(self) -> None:
        # Every task is closed even if one fails; the first failure is raised after the others.
        failure: BaseException | None = None
        for task in self._tasks.values():
            try:
                task.close()
            except BaseException as error:  # noqa: BLE001 - re-raised below, after the other tasks
                failure = failure or error
        if failure is not None:
            raise failure


class BalancedTaskMix(TaskMix):
    """A `TaskMix` whose *trained* mix follows `weights`, not only its drawn one.

    Asynchrony drops long tasks' episodes more often (a long episode spans more weight versions, so
    the version-gap cap catches its group more often), so the trainer sees short tasks more often
    than they are drawn. This mixture draws each task in proportion to its weight over its keep
    rate, the share of its finished episodes that were trained rather than dropped as stale,
    estimated from the run's accounting so far as (trained + 1) / (trained + stale + 1); until a
    task has finished episodes it is drawn by its weight.

    Args: as `TaskMix`.
    """

    def draw_weights(self, counts: Mapping[str, int]) -> dict[str, float]:
        return {name: weight / keep_rate(counts, name) for name, weight in zip(self._names, self._weights)}


def keep_rate(counts: Mapping[str, int], task: str) -> float:
    """The share of `task`'s finished episodes trained rather than dropped as stale, (t + 1) / (t + s + 1)."""
    trained = counts.get(f"{task}/trained", 0)
    stale = counts.get(f"{task}/dropped_stale", 0)
    return (trained + 1) / (trained + stale + 1)
