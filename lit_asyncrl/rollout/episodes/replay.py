"""Continuing an episode that was in flight at a checkpoint: its answered agent turns are replayed
into a fresh environment episode (same instance, same reset seed) instead of being sampled again,
and sampling goes on after them.

A checkpoint records an episode up to its last final token (`Trajectory.committed`: the prompt, the
answered turns with their final versions, the observations); a turn still streaming is sampled
again, since its tokens' versions are provisional until the turn ends. The recorded tokens keep
their mu, versions and any pi_old a route attached. An environment whose answers to the same turns
differ from the recorded ones (a live server, a simulated user) cannot be continued:
`ReplayMismatch`, and the episode is dropped with the reason "restart".
"""

from __future__ import annotations

import copy
import dataclasses

from lit_asyncrl.rollout.records import Trajectory

#: The per-token lists of a trajectory, cut together at its committed length.
_TOKEN_FIELDS = ("token_ids", "loss_mask", "behavior_logprobs", "versions", "old_logprobs", "old_versions")


class ReplayMismatch(Exception):
    """The replayed environment answered otherwise than in the recording."""


@dataclasses.dataclass
class RecordedTurn:
    """One answered agent turn of the recording."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    old_logprobs: list[float]
    old_versions: list[int]


def committed_part(trajectory: Trajectory) -> Trajectory:
    """What a checkpoint keeps of an episode in flight: its tokens up to the last final one, and its
    answered turns (a finished episode whole)."""
    if trajectory.finished and trajectory.later_segments:
        # An agent episode of several segments, which a checkpoint does not hold: played again from its start.
        return Trajectory(group_id=trajectory.group_id, task=trajectory.task)
    kept = copy.deepcopy(trajectory)
    if trajectory.finished:
        return kept
    for name in _TOKEN_FIELDS:
        setattr(kept, name, getattr(kept, name)[: trajectory.committed])
    kept.turn_starts = kept.turn_starts[: trajectory.num_turns]
    return kept


class EpisodeReplay:
    """Reads a recorded trajectory turn by turn for the episode runner (`episode.py`)."""

    def __init__(self, recorded: Trajectory) -> None:
        self.recorded = recorded

    def check(self, trajectory: Trajectory) -> None:
        """After an environment answer: the replayed context agrees with the recording, and the
        answer ends where the recorded one did (at the next recorded turn, or the recording's end)."""
        recorded = self.recorded
        length = len(trajectory.token_ids)
        shared = min(length, len(recorded.token_ids))
        same = (
            trajectory.token_ids[:shared] == recorded.token_ids[:shared]
            and trajectory.loss_mask[:shared] == recorded.loss_mask[:shared]
        )
        turns = trajectory.num_turns
        if turns < recorded.num_turns:
            same = same and length == recorded.turn_starts[turns]
        elif turns == recorded.num_turns and recorded.token_ids and not self._ends_with_a_turn():
            same = same and length == len(recorded.token_ids)  # (an empty recording: the episode had not begun)
        if not same:
            raise ReplayMismatch(
                f"the environment answered otherwise than before the resume (after turn {turns}, {length} tokens)"
            )

    def turn(self, trajectory: Trajectory, index: int) -> RecordedTurn | None:
        """The recorded answered turn `index` (0-based), which starts where `trajectory` ends now;
        None past the recording's answered turns."""
        recorded = self.recorded
        if index >= recorded.num_turns:
            return None
        start = recorded.turn_starts[index]
        if start != len(trajectory.token_ids):
            raise ReplayMismatch(
                f"turn {index} started at token {len(trajectory.token_ids)}, at {start} before the resume"
            )
        end = start
        while end < len(recorded.token_ids) and recorded.loss_mask[end]:
            end += 1
        span = slice(start, end)
        return RecordedTurn(
            token_ids=recorded.token_ids[span],
            logprobs=recorded.behavior_logprobs[span],
            versions=recorded.versions[span],
            old_logprobs=recorded.old_logprobs[span],
            old_versions=recorded.old_versions[span],
        )

    def _ends_with_a_turn(self) -> bool:
        """The recording stops after an answered turn whose environment answer had not come yet."""
        recorded = self.recorded
        return recorded.num_turns > 0 and all(recorded.loss_mask[recorded.turn_starts[-1] :])


def append_recorded(trajectory: Trajectory, turn: RecordedTurn) -> None:
    """Append a recorded turn's tokens with their mu, versions and pi_old as they were."""
    start = len(trajectory.token_ids)
    trajectory.extend_policy(list(turn.token_ids), list(turn.logprobs), list(turn.versions))
    trajectory.old_logprobs[start:] = list(turn.old_logprobs)
    trajectory.old_versions[start:] = list(turn.old_versions)
