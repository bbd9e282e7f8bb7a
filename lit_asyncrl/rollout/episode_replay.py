"""Continuing an episode that was in flight at a checkpoint: its recorded agent turns are replayed
into a fresh environment episode (same instance, same reset seed) instead of being sampled again,
and generation goes on where the recording stops, in the middle of a turn if it stopped there.

The recorded tokens keep their mu, versions and any pi_old a route attached. An environment whose
answers to the same turns differ from the recorded ones (a live server, a simulated user) cannot
be continued: `ReplayMismatch`, and the episode is dropped with the reason "restart".
"""

from __future__ import annotations

import dataclasses

from lit_asyncrl.rollout.records import Trajectory


class ReplayMismatch(Exception):
    """The replayed environment answered otherwise than in the recording."""


@dataclasses.dataclass
class RecordedTurn:
    """The recording's agent tokens from one turn's start: the whole turn, or the part sampled so far."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    old_logprobs: list[float]
    old_versions: list[int]
    complete: bool


class EpisodeReplay:
    """Reads a recorded trajectory turn by turn for the episode runner (`episode.py`)."""

    def __init__(self, recorded: Trajectory) -> None:
        self.recorded = recorded

    def check(self, trajectory: Trajectory) -> None:
        """The replayed context so far agrees with the recording (as far as both go)."""
        length = min(len(trajectory.token_ids), len(self.recorded.token_ids))
        same = (
            trajectory.token_ids[:length] == self.recorded.token_ids[:length]
            and trajectory.loss_mask[:length] == self.recorded.loss_mask[:length]
        )
        if not same:
            raise ReplayMismatch(f"the environment answered otherwise than before the resume (within the first {length} tokens)")

    def turn(self, start: int, index: int) -> RecordedTurn | None:
        """The recorded agent tokens of turn `index` (0-based), which starts at token `start`; None
        when the recording stops before it."""
        recorded = self.recorded
        if start > len(recorded.token_ids) or (start == len(recorded.token_ids) and index >= recorded.num_turns):
            return None
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
            # A turn counted in num_turns was answered by the engine in full; the last one may not be.
            complete=index < recorded.num_turns,
        )


def append_recorded(trajectory: Trajectory, turn: RecordedTurn) -> None:
    """Append a recorded turn's tokens with their mu, versions and pi_old as they were."""
    start = len(trajectory.token_ids)
    trajectory.extend_policy(list(turn.token_ids), list(turn.logprobs), list(turn.versions))
    trajectory.old_logprobs[start:] = list(turn.old_logprobs)
    trajectory.old_versions[start:] = list(turn.old_versions)
