"""What both entry points (Hydra and the Lightning CLI) do between building the parts and `fit`."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger

from lit_asyncrl.datamodule import RolloutDataModule
from lit_asyncrl.fsdp import check_reference_supported
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.rollout.distributed import check_batch_splits
from lit_asyncrl.warm_start import WarmStart, load_tokenizer


def check_settings(module: AsyncRLModule, datamodule: RolloutDataModule, trainer: L.Trainer) -> None:
    """Combinations of module, data and trainer settings, refused before anything starts."""
    module.reference.check_rollout_settings(datamodule.rollouts)
    check_batch_splits(datamodule.rollouts.groups_per_batch, trainer.world_size)
    check_reference_supported(trainer.strategy, module.reference, fidelity=module.fidelity is not None)
    warn_of_replaced_metrics(trainer)


def warn_of_replaced_metrics(trainer: L.Trainer) -> None:
    """Say so when the run's CSV log will replace an earlier run's metrics.csv (Lightning's CSV
    logger deletes it; its own warning, silenced, fires for any non-empty dir)."""
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger) and trainer.is_global_zero:
            metrics = Path(logger.log_dir) / "metrics.csv"
            if metrics.is_file():
                warnings.warn(f"{metrics} holds an earlier run's metrics; this run replaces them", stacklevel=2)


def launch_and_warm_start(
    module: AsyncRLModule, datamodule: RolloutDataModule, warm_start: WarmStart, trainer: L.Trainer, resumed: bool
) -> None:
    """Launch the engines in the background, then run the warm start (not when resuming: a
    checkpoint already holds warmed-up weights).

    Under DDP only rank 0 does either: it hosts the engines, and DDP copies rank 0's weights to
    every rank when it wraps the model, before any hook reads them.
    """
    if trainer.global_rank != 0:
        return
    datamodule.configure_service(trainer)  # the weight route the engines launch with
    # The engines' start (mostly their processes importing) overlaps the warm start.
    datamodule.rollouts.launch_early()
    if not resumed:
        warm_start.run(
            module.policy,
            datamodule.env,
            load_tokenizer(datamodule.model_path),
            log_dir=trainer.log_dir,
            accelerator=trainer.accelerator,
        )
