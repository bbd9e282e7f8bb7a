"""A bare CPU trainer, a per-step metrics recorder, a logger that keeps its rows, and data modules of
ready-made batches, shared by the engine-free unit tests."""

import lightning as L
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader

from tests.support.fakes import FakeRollouts


class StepMetrics(L.Callback):
    """Copies the trainer's callback metrics at the end of each training batch."""

    def __init__(self) -> None:
        self.per_step: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.per_step.append({key: float(value) for key, value in trainer.callback_metrics.items()})


class RecordingLogger(Logger):
    """Keeps every `log_metrics` call as (step, metrics), the rows a CSV logger would write."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append((step, dict(metrics)))

    def keys_at(self, step: int) -> dict[str, float]:
        """Everything logged at `step`, merged over its rows."""
        merged: dict[str, float] = {}
        for row_step, metrics in self.rows:
            if row_step == step:
                merged.update(metrics)
        return merged


def make_trainer(
    max_steps: int, callbacks: list[L.Callback], logger: Logger | bool = False, **trainer_settings
) -> L.Trainer:
    """One CPU device, nothing written to disk, nothing printed; `trainer_settings` go to the Trainer too."""
    return L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        devices=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **trainer_settings,
    )


class ListDataModule(L.LightningDataModule):
    def __init__(self, batches: list[dict], rollouts: FakeRollouts) -> None:
        super().__init__()
        self.batches, self.rollouts = batches, rollouts

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None, num_workers=0)


class PlainDataModule(L.LightningDataModule):
    """Ready-made batches and no rollout service at all."""

    def __init__(self, batches: list[dict]) -> None:
        super().__init__()
        self.batches = batches

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.batches, batch_size=None, num_workers=0)
