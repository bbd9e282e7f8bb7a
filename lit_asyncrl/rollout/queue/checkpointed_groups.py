"""The episodes a checkpoint keeps, as plain values it can hold and give back.

A checkpoint keeps the finished groups pending at its step (tokens, mu, versions, pi_old where a
route attached it, rewards, advantages, group, task), so that a resumed run trains them instead of
regenerating them, and the groups in flight (their episodes so far, the instance and the reset
seeds), so that it continues them (`episode_replay.py`). Only built-in types go in (an instance as
pickled bytes): Lightning may load checkpoints with `torch.load(weights_only=True)`, which refuses
arbitrary classes.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lit_asyncrl.rollout.records import Trajectory

if TYPE_CHECKING:  # the producer imports this module
    from lit_asyncrl.rollout.engine.protocol import Engine
    from lit_asyncrl.rollout.queue.producer import RolloutProducer

_COUNTERS = ("tool_calls", "tool_call_errors", "tool_call_coercions", "reward_failures")


def groups_to_state(groups: list[list[Trajectory]]) -> list[list[dict]]:
    """Each trajectory's fields as a dict of lists, numbers and strings."""
    return [[_trajectory_state(trajectory) for trajectory in group] for group in groups]


def groups_from_state(state: list[list[dict]]) -> list[list[Trajectory]]:
    """The trajectories `groups_to_state` wrote.

    Raises:
        ValueError: a field this version's Trajectory lacks (a checkpoint from a newer library).
    """
    known = {field.name for field in dataclasses.fields(Trajectory)}
    groups = []
    for group in state:
        trajectories = []
        for fields in group:
            unknown = sorted(set(fields) - known)
            if unknown:
                raise ValueError(f"a checkpointed episode has fields this version does not know: {', '.join(unknown)}")
            values = {
                name: (collections.Counter(value) if name in _COUNTERS else value) for name, value in fields.items()
            }
            values["routed_experts"] = _routing_by_version(values.get("routed_experts"))
            trajectories.append(Trajectory(**values))
        groups.append(trajectories)
    return groups


def _routing_by_version(saved: object) -> dict:
    """An episode's recorded routing as this version keeps it (version -> routing). A checkpoint written before
    routings were kept per version holds None (a dense policy's) or one tensor for all versions: that one
    cannot be tied to the versions its positions were computed under, so the episode goes on without it
    (its positions then keep the trainer's own routing, as a position the engine recorded nothing for)."""
    return saved if isinstance(saved, dict) else {}


#: Fields a checkpoint leaves out: a filed group holds an agent episode's segments side by side, and an
#: agent episode in flight is played again from its start after a resume (`agent_endpoint/episodes.py`).
_NOT_CHECKPOINTED = ("later_segments",)


def _trajectory_state(trajectory: Trajectory) -> dict:
    state = {}
    for field in dataclasses.fields(Trajectory):
        if field.name in _NOT_CHECKPOINTED:
            continue
        value = getattr(trajectory, field.name)
        state[field.name] = (
            dict(value) if field.name in _COUNTERS else (list(value) if isinstance(value, list) else value)
        )
    return state


def in_flight_groups(engines: Sequence[Engine | None], producers: Sequence[RolloutProducer | None]) -> list[dict]:
    """Each live lane's groups in flight (`RolloutProducer.in_flight_state`), read on its engine's loop."""
    groups = []
    for engine, producer in zip(engines, producers):
        if engine is None or producer is None or engine.dead_reason() is not None:
            continue

        async def read(producer: RolloutProducer = producer) -> list[dict]:
            return producer.in_flight_state()

        try:
            groups += engine.run(read(), timeout_s=60)
        except Exception as error:  # a loop that does not answer, an engine that died: generated anew after a resume
            warnings.warn(f"an engine's groups in flight are not in this checkpoint ({error!r})", stacklevel=2)
    return groups


def not_settled(in_flight: list[dict], settled: set[int]) -> list[dict]:
    """The groups read in flight that did not leave generation since (read first, a group may be
    filed or dropped before the buffer is read: then the buffer's counts hold it)."""
    return [group for group in in_flight if group["group_id"] not in settled]


def next_group_id(restored: list[list[Trajectory]], in_flight: list[dict]) -> int:
    """The first id past every group a resume put back, pending or in flight."""
    ids = [trajectory.group_id for group in restored for trajectory in group] + [
        group["group_id"] for group in in_flight
    ]
    return max(ids, default=-1) + 1


def resumable(in_flight: list[dict], group_size: int) -> list[dict]:
    """The recorded groups a run with `group_size` can continue (a group of another size would skew
    its advantages; it is generated anew, with a warning)."""
    kept = [group for group in in_flight if len(group["episodes"]) == group_size]
    if len(kept) < len(in_flight):
        warnings.warn(
            f"{len(in_flight) - len(kept)} groups in flight at the checkpoint have another group size than "
            f"{group_size}: generated anew",
            stacklevel=2,
        )
    return kept
