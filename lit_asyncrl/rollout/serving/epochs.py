"""Epochs over a task's fixed list of training instances (a dataset's rows).

A task that lists its training instances (`Environment.training_instances`) is played in epochs:
each epoch is the whole list in an order shuffled by the run's seed and the epoch's number, so two
runs with one seed play the same prompts in the same order. The position in the epoch is part of a
checkpoint: a resumed run goes on from it, so within an epoch no prompt is played twice or skipped
across a kill and resume (the groups in flight at the checkpoint are continued, not drawn again).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping, Sequence
from typing import Any


class EpochOrder:
    """One task's training instances, dealt epoch after epoch, each epoch in its own shuffled order.

    Several engine lanes draw from one order (each on its own thread), hence the lock.
    """

    def __init__(self, instances: Sequence[Any], seed: int) -> None:
        if not instances:
            raise ValueError("a task listing its training instances must list at least one")
        self.instances = list(instances)
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._shuffled(0)
        self._lock = threading.Lock()

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(len(self.instances)))
        # A string seed is hashed the same way in every process (unlike `hash` of a tuple).
        random.Random(f"epoch {epoch} of seed {self.seed}").shuffle(order)
        return order

    def next(self) -> Any:
        """The next instance; the first of the next epoch after the last of this one."""
        with self._lock:
            if self.position == len(self.instances):
                self.epoch += 1
                self.position = 0
                self._order = self._shuffled(self.epoch)
            instance = self.instances[self._order[self.position]]
            self.position += 1
            return instance

    @property
    def epochs_started(self) -> float:
        """Epochs dealt so far, the current one by its share dealt (1.5: half-way through the second)."""
        return self.epoch + self.position / len(self.instances)

    def state_dict(self) -> dict[str, int]:
        with self._lock:
            return {"epoch": self.epoch, "position": self.position, "size": len(self.instances)}

    def load_state_dict(self, state: Mapping[str, int], task: str) -> None:
        """Go on from a checkpoint's position; `task` names the task in the error.

        Raises:
            ValueError: when the checkpoint's run listed another number of training instances (the
                dataset changed: the positions would name other prompts).
        """
        if state["size"] != len(self.instances):
            raise ValueError(
                f"{task} lists {len(self.instances)} training instances, the checkpoint's run listed "
                f"{state['size']}: resume with the same dataset and held-out split"
            )
        with self._lock:
            self.epoch = state["epoch"]
            self.position = state["position"]
            self._order = self._shuffled(self.epoch)
