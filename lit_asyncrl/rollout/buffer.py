"""A bounded, staleness-aware buffer of finished advantage groups, shared by engine and trainer.

Accounting holds at every moment: produced = trained + dropped + pending (in episodes). Episodes
leave only by being handed to the trainer or by being dropped with a counted reason.
"""

from __future__ import annotations

import collections
import threading
import time

from lit_asyncrl.rollout.records import Trajectory


class RolloutBuffer:
    """Groups of trajectories waiting for the trainer.

    Args:
        capacity: most episodes held (pending plus those reserved by in-flight groups); the engine
            waits for room, which throttles generation when training falls behind.
        max_version_gap: a group whose oldest policy token is more than this many versions behind
            the trainer is dropped (reason "stale") instead of trained on.
    """

    def __init__(self, capacity: int, max_version_gap: int) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity must be >= 1, got {capacity}")
        if max_version_gap < 0:
            raise ValueError(f"max_version_gap must be >= 0, got {max_version_gap}")
        self.capacity = capacity
        self.max_version_gap = max_version_gap
        self._groups: collections.deque[list[Trajectory]] = collections.deque()
        self._reserved = 0
        self._trainer_version = 0
        self._condition = threading.Condition()
        self.produced = 0
        self.trained = 0
        self.dropped: collections.Counter[str] = collections.Counter()

    # -- accounting -----------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        with self._condition:
            return sum(len(group) for group in self._groups)

    @property
    def num_dropped(self) -> int:
        return sum(self.dropped.values())

    def counts(self) -> dict[str, int]:
        """A consistent reading of the accounting (taken under the lock)."""
        with self._condition:
            return {
                "produced": self.produced,
                "trained": self.trained,
                "dropped": self.num_dropped,
                "dropped_stale": self.dropped["stale"],
                **{f"dropped_{reason}": count for reason, count in self.dropped.items() if reason != "stale"},
                "pending": sum(len(group) for group in self._groups),
            }

    def pending_trajectories(self) -> list[Trajectory]:
        with self._condition:
            return [trajectory for group in self._groups for trajectory in group]

    def oldest_pending_version(self) -> int | None:
        """The oldest weight version among pending policy tokens (None when nothing is pending)."""
        with self._condition:
            return min((v for group in self._groups if (v := _oldest_version(group)) is not None), default=None)

    def accounting_holds(self) -> bool:
        with self._condition:
            return self.produced == self.trained + self.num_dropped + sum(len(g) for g in self._groups)

    # -- producer side -----------------------------------------------------------------------
    def try_reserve(self, num_episodes: int) -> bool:
        """Reserve room for a group about to be generated; False when the buffer is full."""
        with self._condition:
            held = sum(len(group) for group in self._groups) + self._reserved
            if held + num_episodes > self.capacity:
                return False
            self._reserved += num_episodes
            return True

    def put_group(self, group: list[Trajectory], reserved: int) -> None:
        """Add a finished group and release the room it reserved."""
        with self._condition:
            self._reserved -= reserved
            self.produced += len(group)
            self._groups.append(group)
            self._condition.notify_all()

    def drop_produced(self, num_episodes: int, reason: str) -> None:
        """Count episodes that were produced but can never be trained on (e.g. the environment failed them)."""
        with self._condition:
            self.produced += num_episodes
            self.dropped[reason] += num_episodes

    def release(self, reserved: int) -> None:
        """Give back room reserved by a group that was cancelled before it finished."""
        with self._condition:
            self._reserved -= reserved

    # -- trainer side --------------------------------------------------------------------------
    def set_trainer_version(self, version: int) -> None:
        with self._condition:
            self._trainer_version = version
            self._drop_stale()

    @property
    def trainer_version(self) -> int:
        return self._trainer_version

    def take(self, num_groups: int, timeout_s: float | None = None) -> list[list[Trajectory]]:
        """Wait for `num_groups` fresh groups and hand them to the trainer (oldest first)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._condition:
            while True:
                self._drop_stale()
                if len(self._groups) >= num_groups:
                    taken = [self._groups.popleft() for _ in range(num_groups)]
                    self.trained += sum(len(group) for group in taken)
                    self._condition.notify_all()
                    return taken
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"waited {timeout_s} s for {num_groups} rollout groups, have {len(self._groups)}")
                self._condition.wait(remaining if remaining is not None else 1.0)

    def _drop_stale(self) -> None:
        oldest_allowed = self._trainer_version - self.max_version_gap
        fresh = collections.deque(g for g in self._groups if _oldest_version(g) is None or _oldest_version(g) >= oldest_allowed)
        self.dropped["stale"] += sum(len(g) for g in self._groups) - sum(len(g) for g in fresh)
        self._groups = fresh


def _oldest_version(group: list[Trajectory]) -> int | None:
    """The oldest version among the group's policy tokens; None when it has none (nothing can be stale)."""
    return min((t.oldest_version for t in group if t.num_policy_tokens), default=None)
