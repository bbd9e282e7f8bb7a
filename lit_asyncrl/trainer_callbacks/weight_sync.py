"""Publishes the trainer's weights to the rollout service: at train start, then after every step."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import lightning as L
import torch
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lit_asyncrl.models.lora import LoRASettings, engine_weights
from lit_asyncrl.rollout.service import RolloutService
from lit_asyncrl.trainer_callbacks.find import ServiceCallback


class EngineWeightSync(ServiceCallback):
    """The weight version is `trainer.global_step`: the number of optimizer steps taken.

    The service decides from its `weight_sync_every` which versions it pushes to generation; it
    hears of every version so that it can drop groups past its staleness cap.

    Args:
        rollouts, required: see `ServiceCallback`.
        module_attr: dotted attribute of the LightningModule holding the policy whose weights are published.
        lora: the policy's LoRA settings: with an adapter, a version is the adapter's tensors or,
            with `push="merged"`, the weights with the adapter folded in (`lit_asyncrl.models.lora`).
    """

    def __init__(
        self,
        rollouts: RolloutService | None = None,
        module_attr: str = "policy",
        required: bool = True,
        lora: LoRASettings | None = None,
    ) -> None:
        super().__init__(rollouts, required)
        self.module_attr = module_attr
        self.lora = lora if lora is not None else LoRASettings()
        self._started = False

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._started = False

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The held-out evaluation before training (sanity check) or in `validate` needs the engine;
        # `validate` alone generates no training rollouts.
        self._start(trainer, pl_module, train=trainer.state.fn == "fit")

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer, pl_module, train=True)

    def _start(self, trainer: L.Trainer, pl_module: L.LightningModule, train: bool) -> None:
        if self.rollouts is None or self._started:
            return
        # Not on_fit_start: a resumed global_step is only restored after that hook.
        self.rollouts.start(self._weights(pl_module), version=trainer.global_step, train=train)
        self._started = True

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT, batch: object, batch_idx: int
    ) -> None:
        if self.rollouts is None:
            return
        pushed = self.rollouts.publish_weights(self._weights(pl_module), trainer.global_step)
        if pushed is not None:
            pl_module.log("rollout/weight_push_s", pushed.write_s + pushed.pause_s, batch_size=1)
            pl_module.log("rollout/engine_pause_s", pushed.pause_s, batch_size=1)
            # What one engine loaded for this version (each engine loads the same).
            pl_module.log("rollout/weight_push_bytes", float(pushed.bytes), batch_size=1)
            if pushed.moved_turns is not None:  # `model.lora.in_flight`
                pl_module.log("rollout/moved_turns", float(pushed.moved_turns), batch_size=1)

    def _weights(self, pl_module: L.LightningModule) -> Mapping[str, torch.Tensor]:
        return engine_weights(functools.reduce(getattr, self.module_attr.split("."), pl_module), self.lora)
