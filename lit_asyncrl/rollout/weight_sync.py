"""Pushes the trainer's weights to the engine: once at train start, then every k optimizer steps."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override


class EngineWeightSync(L.Callback):
    """The version of the weights is `trainer.global_step`: the number of optimizer steps taken.

    Expects the trainer's datamodule to be a `RolloutDataModule` and the module to hold `policy`.
    """

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trainer.datamodule.start_rollouts(pl_module.policy.state_dict(), version=trainer.global_step)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT, batch: object, batch_idx: int) -> None:
        datamodule = trainer.datamodule
        version = trainer.global_step
        datamodule.buffer.set_trainer_version(version)
        if version % datamodule.weight_sync_every == 0:
            timings = datamodule.push_weights(pl_module.policy.state_dict(), version)
            pl_module.log("rollout/weight_push_s", timings["write_s"] + timings["pause_s"], batch_size=1)
            pl_module.log("rollout/engine_pause_s", timings["pause_s"], batch_size=1)
