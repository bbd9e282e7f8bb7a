"""Run by test_ewma_subprocess.py: a 2-process CPU DDP fit with EWMAReference; each rank saves its state.

The ranks are forked from this process (Lightning's `ddp_fork`), so Lightning is imported once.

Usage: python ewma_ddp_run.py OUT_DIR. The ranks see different data, log different monitored values and observe
different version gaps, so their averages agree only if the callback gathers its decisions across ranks.

Both ranks run without vLLM, Hydra, OmegaConf and lit_asyncrl (blocked before anything is imported): the
callbacks package must work in another Lightning project. Each rank checks that every exported callback imports
and that none of the blocked packages was imported or became importable.
"""

import sys

BLOCKED = ("vllm", "hydra", "omegaconf", "lit_asyncrl")
for name in [name for name in sys.modules if name.split(".")[0] in BLOCKED]:
    del sys.modules[name]  # anything the interpreter's start imported
for name in BLOCKED:
    sys.modules[name] = None  # `import name` raises ImportError; `find_spec(name)` reports it missing

from pathlib import Path  # noqa: E402  (the block above must come first)

import asyncrl_callbacks  # noqa: E402
import torch  # noqa: E402
from asyncrl_callbacks import EWMAReference  # noqa: E402
from ewma_models import SGDModel, loader  # noqa: E402
from lightning.pytorch import Callback, Trainer  # noqa: E402

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
            exported=sorted(name for name in asyncrl_callbacks.__all__ if getattr(asyncrl_callbacks, name) is not None),
            leaked=sorted(name for name, module in sys.modules.items() if name.split(".")[0] in BLOCKED and module),
            importable=[name for name in BLOCKED if _importable(name)],
        )
        torch.save(state, self.out / f"rank{trainer.global_rank}.pt")


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def main(out: Path) -> None:
    torch.set_num_threads(1)
    ewma = EWMAReference(staleness_window="auto", module_attr="policy", tau=0.5, patience=2)
    model = SGDModel(values=VALUES, gaps=GAPS, ewmas=[ewma], rank_offset=True)
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_fork",
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
