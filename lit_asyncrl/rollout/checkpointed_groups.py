"""Finished groups that wait for the trainer, as plain values a checkpoint can hold and give back.

A checkpoint keeps the episodes pending at its step (tokens, mu, versions, pi_old where a route
attached it, rewards, advantages, group, task) so that a resumed run trains them instead of
regenerating them. Only built-in types go in: Lightning may load checkpoints with
`torch.load(weights_only=True)`, which refuses arbitrary classes.
"""

from __future__ import annotations

import collections
import dataclasses

from lit_asyncrl.rollout.records import Trajectory

_COUNTERS = ("tool_calls", "tool_call_errors")


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
            values = {name: (collections.Counter(value) if name in _COUNTERS else value) for name, value in fields.items()}
            trajectories.append(Trajectory(**values))
        groups.append(trajectories)
    return groups


def _trajectory_state(trajectory: Trajectory) -> dict:
    state = {}
    for field in dataclasses.fields(Trajectory):
        value = getattr(trajectory, field.name)
        state[field.name] = dict(value) if field.name in _COUNTERS else (list(value) if isinstance(value, list) else value)
    return state
