"""Tiny Lightning modules for the EWMA callback tests (in the spirit of Lightning's BoringModel).

Imported by the tests and by the subprocess scripts, so it needs only torch and Lightning.
"""

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

MONITOR = "train/train_infer_mask"


def loader(n: int = 8, batch_size: int = 2) -> DataLoader:
    """A fixed, unshuffled data set: every run sees the same batches in the same order."""
    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, 4, generator=generator), torch.randn(n, 3, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def tiny_trainer(root, max_steps: int, callbacks: list, **kwargs) -> Trainer:
    """A quiet CPU Trainer."""
    defaults = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return Trainer(
        default_root_dir=root,
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        callbacks=callbacks,
        **(defaults | kwargs),
    )


class ScriptedModel(LightningModule):
    """Manual optimization that *sets* the policy's weights: after optimizer step ``k`` they are ``script[k]``.

    ``script`` is ``[steps + 1, n_params]``; row 0 is the start. ``values[k]`` (``None``: not logged) is logged
    under ``MONITOR`` and ``gaps[k]`` is fed to ``ewma.observe_version_gaps`` in the batch that makes step ``k+1``.
    With ``step_every=2`` only every second batch steps (like gradient accumulation).
    """

    def __init__(self, script: Tensor, values=None, gaps=None, ewma=None, step_every: int = 1) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.policy = nn.Linear(4, 3)
        self.script, self.values, self.gaps, self.ewma, self.step_every = script, values, gaps, ewma, step_every
        self.reference_outputs: list[tuple[Tensor, Tensor]] = []
        torch.nn.utils.vector_to_parameters(script[0], self.policy.parameters())

    def forward(self, x: Tensor) -> Tensor:
        return self.policy(x)

    def training_step(self, batch, batch_idx):
        if batch_idx % self.step_every != self.step_every - 1:
            return
        step = self.global_step
        if self.ewma is not None:
            self.reference_outputs.append((batch[0], self.ewma.reference_forward(batch[0])))
            if self.gaps is not None:
                self.ewma.observe_version_gaps(torch.tensor(self.gaps[step]))
        if self.values is not None and self.values[step] is not None:
            self.log(MONITOR, self.values[step])
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(self.script[step + 1], self.policy.parameters())
        self.optimizers().step()  # counts the step; there are no gradients, so SGD changes nothing

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SGDModel(LightningModule):
    """Automatic optimization with SGD on a linear regression; optional scripted metric and gaps.

    The batch is drawn from the global step (and the rank), not from the loader: Lightning restarts a
    non-resumable loader from its first batch after a mid-epoch resume, as an RL stream would not.
    """

    def __init__(self, values=None, gaps=None, ewmas=(), rank_offset: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.policy = nn.Linear(4, 3)
        self.values, self.gaps, self.ewmas, self.rank_offset = values, gaps, ewmas, rank_offset

    def training_step(self, batch, batch_idx):
        step, rank = self.global_step, self.global_rank if self.rank_offset else 0
        generator = torch.Generator().manual_seed(1000 * step + self.global_rank)
        x, y = torch.randn(2, 4, generator=generator), torch.randn(2, 3, generator=generator)
        for ewma in self.ewmas:
            ewma.reference_forward(x)
            if self.gaps is not None:
                ewma.observe_version_gaps(torch.tensor([self.gaps[step] + 3 * rank]))
        if self.values is not None:
            self.log(MONITOR, self.values[step] + 0.9 * rank)  # ranks disagree when rank_offset is set
        return nn.functional.mse_loss(self.policy(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
