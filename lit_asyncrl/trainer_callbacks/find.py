"""Where a callback finds the rollout service when none is given to its constructor."""

from __future__ import annotations

import lightning as L

from lit_asyncrl.rollout.service import RolloutService


def rollouts_of(trainer: L.Trainer, who: str, required: bool = True) -> RolloutService | None:
    """The `rollouts` service of the trainer's datamodule; a clear error naming `who` otherwise
    (or None when not `required`)."""
    rollouts = getattr(trainer.datamodule, "rollouts", None)
    if not isinstance(rollouts, RolloutService):
        if not required:
            return None
        raise TypeError(
            f"{who} needs a rollout service: pass one to its constructor, or fit with a datamodule whose "
            f"`rollouts` implements lit_asyncrl.rollout.service.RolloutService (got {type(trainer.datamodule).__name__})"
        )
    return rollouts
