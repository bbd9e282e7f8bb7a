"""Where a callback finds the rollout service when none is given to its constructor."""

from __future__ import annotations

import lightning as L
from typing_extensions import override

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
            "`rollouts` implements lit_asyncrl.rollout.service.RolloutService "
            f"(got {type(trainer.datamodule).__name__})"
        )
    return rollouts


class ServiceCallback(L.Callback):
    """A callback that acts on a rollout service: the one given, or the datamodule's `rollouts`.

    Args:
        rollouts: the service; None = the datamodule's `rollouts`.
        required: fail when no service is found; False makes the callback do nothing then (the
            module adds its callbacks that way, so it also trains on a DataModule of ready-made batches).
    """

    def __init__(self, rollouts: RolloutService | None = None, required: bool = True) -> None:
        self.rollouts = rollouts
        self.required = required

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.rollouts is None:
            self.rollouts = rollouts_of(trainer, type(self).__name__, required=self.required)
