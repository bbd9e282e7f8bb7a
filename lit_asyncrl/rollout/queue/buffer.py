"""A bounded, staleness-aware buffer of finished advantage groups, shared by engine and trainer.

Accounting holds at every moment: produced = trained + dropped + pending (in episodes; an agent
program's episode filed as several segments counts one per segment, `rollout/agent_endpoint`).
Episodes leave only by being handed to the trainer or by being dropped with a counted reason.

On a mixture of tasks the buffer also counts, per task, the episodes produced, trained and dropped
as stale: the staleness cap drops long episodes more often than short ones, so the mix the trainer
sees can differ from the mix drawn, and these counts show by how much.
"""

from __future__ import annotations

import collections
import threading
import time

from lit_asyncrl.rollout.queue.checkpointed_groups import groups_from_state, groups_to_state
from lit_asyncrl.rollout.queue.group_filter import GroupFilter
from lit_asyncrl.rollout.records import Trajectory


class RolloutBuffer:
    """Groups of trajectories waiting for the trainer.

    Args:
        capacity: most episodes held (pending plus those reserved by in-flight groups); the engine
            waits for room, which throttles generation when training falls behind.
        max_version_gap: a group whose oldest policy token is more than this many versions behind
            the trainer is dropped (reason "stale") instead of trained on.
        group_filter: groups without a learning signal dropped (reason "zero_advantage") and
            episodes kept out of the loss as they arrive (`group_filter.py`; off by default).
    """

    def __init__(self, capacity: int, max_version_gap: int, group_filter: GroupFilter = GroupFilter()) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity must be >= 1, got {capacity}")
        if max_version_gap < 0:
            raise ValueError(f"max_version_gap must be >= 0, got {max_version_gap}")
        self.capacity = capacity
        self.max_version_gap = max_version_gap
        self.group_filter = group_filter
        #: Groups dropped for lacking a signal since the last batch was taken (the filter's cap).
        self._drops_since_batch = 0
        #: Episodes of groups without signal trained on because a batch reached the cap, and
        #: episodes kept out of the loss as cut off (counted only while their filter is on).
        self.zero_advantage_kept = 0
        self.masked_overlong = 0
        self._groups: collections.deque[list[Trajectory]] = collections.deque()
        self._reserved = 0
        self._trainer_version = 0
        self._condition = threading.Condition()
        self.produced = 0
        self.trained = 0
        self.dropped: collections.Counter[str] = collections.Counter()
        #: A mixture's episodes by "<task>/<produced|trained|dropped_stale>" (empty for a single task).
        self.by_task: collections.Counter[str] = collections.Counter()
        #: Episodes a resume put back from the checkpoint and how many of them were trained since; and
        #: trained episodes of the groups it continued (in flight at the checkpoint, `resumed`).
        self.restored = 0
        self.restored_trained = 0
        self.resumed_trained = 0
        self._restored_groups: set[int] = set()
        self._resumed_groups: set[int] = set()
        #: The latest groups that left generation (filed, dropped by the filter, or all failed): a
        #: checkpoint leaves them out of the groups it records in flight.
        self._settled: collections.deque[int] = collections.deque(maxlen=4096)

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
                **self.by_task,
                **self._filter_counts(),
                **(
                    {"restored": self.restored, "restored_trained": self.restored_trained}
                    if self._restored_groups
                    else {}
                ),
                **({"resumed_trained": self.resumed_trained} if self._resumed_groups else {}),
            }

    def _filter_counts(self) -> dict[str, int]:
        """The group filter's counts, each while its filter is on (a run without filters logs and keeps none)."""
        return {
            **({"zero_advantage_kept": self.zero_advantage_kept} if self.group_filter.zero_advantage else {}),
            **({"masked_overlong": self.masked_overlong} if self.group_filter.overlong else {}),
        }

    def state_dict(self, keep_pending: bool) -> dict:
        """What a checkpoint keeps: the counts, and with `keep_pending` the pending groups themselves.

        Groups already too stale for the trainer's version are dropped first (the next `take` would
        drop them): a group filed between a weight publish and the checkpoint can be, and a resume
        would otherwise put back as pending what it drops at once."""
        with self._condition:
            self._drop_stale()
            state = {
                "produced": self.produced,
                "trained": self.trained,
                "dropped": dict(self.dropped),
                "pending": sum(len(group) for group in self._groups),
                "by_task": dict(self.by_task),
                **self._filter_counts(),
            }
            if keep_pending:
                state["pending_groups"] = groups_to_state(list(self._groups))
            return state

    def settled_groups(self) -> set[int]:
        """Ids of the latest groups that left generation (read after the groups in flight: the rest)."""
        with self._condition:
            return set(self._settled)

    def load_state_dict(self, state: dict, keep_pending: bool = True) -> list[list[Trajectory]]:
        """Carry a checkpoint's counts over, and its pending groups when it kept them and `keep_pending`
        (they are pending again, to be trained); pending episodes not put back count as dropped with
        the reason "restart" (the resumed run generates others). Returns the groups put back."""
        restored = groups_from_state(state["pending_groups"]) if keep_pending and "pending_groups" in state else []
        with self._condition:
            self.produced += state["produced"]
            self.trained += state["trained"]
            self.dropped.update(state["dropped"])
            self.dropped["restart"] += state["pending"] - sum(len(group) for group in restored)
            self.by_task.update(state.get("by_task", {}))  # checkpoints of earlier versions have none
            self.zero_advantage_kept += state.get("zero_advantage_kept", 0)
            self.masked_overlong += state.get("masked_overlong", 0)
            self._groups.extend(restored)
            self.restored += sum(len(group) for group in restored)
            self._restored_groups.update(group[0].group_id for group in restored)
            self._condition.notify_all()
        return restored

    def resumed(self, group_ids: list[int]) -> None:
        """Groups a resume continues (in flight at the checkpoint): counted in `restored_trained` once trained."""
        with self._condition:
            self._resumed_groups.update(group_ids)

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

    def put_group(self, group: list[Trajectory], reserved: int) -> bool:
        """Add a finished group and release the room it reserved; False when the group filter
        dropped it (counted as "zero_advantage"), so that a producer can start another in its place."""
        with self._condition:
            self._reserved -= reserved
            self._settled.append(group[0].group_id)
            self.produced += len(group)
            self._count_tasks(group, "produced")
            self.masked_overlong += self.group_filter.mask_overlong(group)
            if self.group_filter.lacks_signal(group):
                if self._drops_since_batch < self.group_filter.max_drops_per_batch:
                    self._drops_since_batch += 1
                    self.dropped["zero_advantage"] += len(group)
                    self._condition.notify_all()  # room came back
                    return False
                self.zero_advantage_kept += len(group)
            self._groups.append(group)
            self._condition.notify_all()
            return True

    def drop_produced(self, num_episodes: int, reason: str) -> None:
        """Count episodes that were produced but can never be trained on (e.g. the environment failed them)."""
        with self._condition:
            self.produced += num_episodes
            self.dropped[reason] += num_episodes

    def release(self, reserved: int, group_id: int | None = None) -> None:
        """Give back room reserved by a group that was cancelled, or (`group_id`) whose every episode
        failed and was dropped."""
        with self._condition:
            self._reserved -= reserved
            if group_id is not None:
                self._settled.append(group_id)

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
                    self._drops_since_batch = 0
                    for group in taken:
                        self._count_tasks(group, "trained")
                        self.restored_trained += len(group) if group[0].group_id in self._restored_groups else 0
                        self.resumed_trained += len(group) if group[0].group_id in self._resumed_groups else 0
                    self._condition.notify_all()
                    return taken
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"waited {timeout_s} s for {num_groups} rollout groups, have {len(self._groups)}"
                    )
                self._condition.wait(remaining if remaining is not None else 1.0)

    def _drop_stale(self) -> None:
        oldest_allowed = self._trainer_version - self.max_version_gap
        fresh = collections.deque()
        stale = []
        for group in self._groups:
            (fresh if _oldest_version(group) is None or _oldest_version(group) >= oldest_allowed else stale).append(
                group
            )
        for group in stale:
            self.dropped["stale"] += len(group)
            self._count_tasks(group, "dropped_stale")
        self._groups = fresh

    def _count_tasks(self, group: list[Trajectory], outcome: str) -> None:
        for trajectory in group:
            if trajectory.task is not None:
                self.by_task[f"{trajectory.task}/{outcome}"] += 1


def _oldest_version(group: list[Trajectory]) -> int | None:
    """The oldest version among the group's policy tokens; None when it has none (nothing can be stale)."""
    return min((t.oldest_version for t in group if t.num_policy_tokens), default=None)
