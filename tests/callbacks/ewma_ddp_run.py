"""Run by test_ewma_subprocess.py: a 2-process CPU DDP fit with EWMAReference; each rank saves its state.

Usage: python ewma_ddp_run.py OUT_DIR. The ranks see different data, log different monitored values and observe
different version gaps, so their averages agree only if the callback gathers its decisions across ranks.
"""

import sys
from pathlib import Path

import torch
from asyncrl_callbacks import EWMAReference
from ewma_models import SGDModel, loader
from lightning.pytorch import Callback, Trainer

STEPS = 7  # resets at steps 2, 4 and 6 (patience 2); step 7 moves the average off the live weights again
VALUES = [0.0] * STEPS  # rank 0 logs 0.0 (low), rank 1 logs 0.9 (high): the mean 0.45 is low
GAPS = [1, 0, 2, 1, 0, 1, 0]  # rank 1 adds 3: W must become max over ranks, 5


class SaveState(Callback):
    def __init__(self, ewma: EWMAReference, out: Path) -> None:
        self.ewma, self.out = ewma, out

    def on_train_end(self, trainer, pl_module):
        state = dict(
            average={name: t.clone() for name, t in self.ewma.averaged_parameters.items()},
            live={name: p.detach().clone() for name, p in pl_module.policy.named_parameters()},
            resets=self.ewma.num_resets,
            window=self.ewma.staleness_window,
            total_weight=self.ewma._total_weight,
        )
        torch.save(state, self.out / f"rank{trainer.global_rank}.pt")


def main(out: Path) -> None:
    torch.set_num_threads(1)
    ewma = EWMAReference(staleness_window="auto", module_attr="policy", tau=0.5, patience=2)
    model = SGDModel(values=VALUES, gaps=GAPS, ewmas=[ewma], rank_offset=True)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=STEPS,
        callbacks=[ewma, SaveState(ewma, out)],
        default_root_dir=out,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, loader(n=4 * STEPS, batch_size=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
