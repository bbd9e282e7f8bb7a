"""How a tool episode ended, as its grader sees it.

A tool task grades an episode once, when it ends (`ToolEnv.grade`). The grader gets the instance, the
final state, the transcript and the reason the episode ended: the task's own endings (the agent
answered without a call and no user was there to reply, the user ended the conversation, the task
said it was finished) and the cut-offs, where the run stopped the play before the task did.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: The agent's turn held no call and the task has no user to answer it.
NO_CALL = "no_call"
#: The task's user ended the conversation (its reply was None).
USER_ENDED = "user_ended"
#: `ToolEnv.finished` became True (e.g. a tool that closes the case was called).
FINISHED = "finished"
#: The episode used its turn limit (`ToolEnv.turn_limit`).
TURNS = "turns"
#: The run's context (`rollout.max_model_len`) filled before the task ended.
CONTEXT = "context"
#: The episode ran past the task's `episode_timeout_s`.
TIMEOUT = "timeout"
#: Endings where the run, not the task, stopped the play. The turn limit is graded always (as it
#: always was); the other two only by a task that sets `ToolEnv.grades_cut_offs`.
CUT_OFFS = (TURNS, CONTEXT, TIMEOUT)


@dataclasses.dataclass(frozen=True)
class Ending:
    """What a tool task's grader reads: the episode's instance, its final state, its transcript
    (OpenAI-style messages, the opening included) and why it ended (one of the reasons above)."""

    instance: Any
    state: Any
    transcript: list[dict[str, Any]]
    reason: str

    @property
    def cut_off(self) -> bool:
        """Whether the run stopped the play before the task ended it."""
        return self.reason in CUT_OFFS
