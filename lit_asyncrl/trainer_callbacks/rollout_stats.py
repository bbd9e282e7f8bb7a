"""Logs the rollout service's statistics each step, and the key ones on the progress bar."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities.types import STEP_OUTPUT
from typing_extensions import override

from lit_asyncrl.trainer_callbacks.find import ServiceCallback

#: Progress-bar label of each statistic shown there.
PROGRESS_BAR = {"rollout/queue_depth": "queue", "rollout/tokens_per_s": "tok/s"}


class RolloutStatsLogger(ServiceCallback):
    """`rollout/*` (queue, accounting produced = trained + dropped + pending, tokens/s) and `dedicated/*`.

    Args: see `ServiceCallback`.
    """

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: STEP_OUTPUT, batch: object, batch_idx: int
    ) -> None:
        if self.rollouts is None:
            return
        stats = self.rollouts.stats()
        pl_module.log_dict(stats, on_step=True, on_epoch=False, batch_size=1)
        shown = {label: stats[key] for key, label in PROGRESS_BAR.items() if key in stats}
        pl_module.log_dict(shown, prog_bar=True, logger=False, on_step=True, on_epoch=False, batch_size=1)
