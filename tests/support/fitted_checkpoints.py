"""Checkpoints of short engine-free fits of the tiny policy, for the tests of what reads checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch

from lit_asyncrl.losses import PPOClip
from lit_asyncrl.module import AsyncRLModule
from tests.support.batches import all_version, make_batch
from tests.support.lightning import PlainDataModule, make_trainer


def fitted_checkpoint(folder: Path, **module_args) -> Path:
    """A checkpoint after 2 optimizer steps at a large learning rate (the weights move visibly)."""
    torch.manual_seed(0)
    module = AsyncRLModule(loss=PPOClip(), lr=1e-2, **module_args)
    batches = [make_batch(all_version(0), [1.0, 0.0, 0.0, 0.0]), make_batch(all_version(1), [1.0, 1.0, 0.0, 0.0])]
    trainer = make_trainer(2, [])
    trainer.fit(module, datamodule=PlainDataModule(batches))
    path = folder / "run" / "checkpoints" / "last.ckpt"
    trainer.save_checkpoint(path)
    return path
