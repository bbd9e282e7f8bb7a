"""A callback the scale-out test adds to a DDP or FSDP2 run: what each rank trained on, and its EWMA state."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from asyncrl_callbacks import EWMAReference

from lit_asyncrl.rollout.serving.distributed import whole_tensors

#: This rank's own step metrics kept per step (a rank's `callback_metrics` hold its local values).
STEP_METRICS = (
    "train/ref_behavior_logratio_absmax",
    "train/nonfinite_tokens",
    "fidelity/logratio_absmax",
    "train/version_gap_max",
)


class RankProbe(L.Callback):
    """Records the group ids of every batch this rank trains on and its own step metrics; at the
    end saves them, the EWMA average (when the run has one), the live weights and (rank 0) the
    rollout accounting to `<out_dir>/rank<r>.pt`."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.group_ids: list[list[int]] = []
        #: Per batch: each episode's success and, in a mixture of tasks, its task's index.
        self.success: list[list[float]] = []
        self.task_ids: list[list[int]] = []
        self.step_metrics: list[dict[str, float]] = []

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # After the datamodule's setup: `rollouts` is the DDP wrapper every rank reads batches from.
        rollouts = trainer.datamodule.rollouts
        next_batch = rollouts.next_batch

        def recording_next_batch(timeout_s: float) -> dict:
            batch = next_batch(timeout_s)
            self.group_ids.append(batch["group_ids"].tolist())
            self.success.append(batch["success"].tolist())
            self.task_ids.append(batch["task_ids"].tolist() if "task_ids" in batch else [])
            return batch

        rollouts.next_batch = recording_next_batch

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        metrics = trainer.callback_metrics
        self.step_metrics.append({key: float(metrics[key]) for key in STEP_METRICS if key in metrics})

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        ewmas = [callback for callback in trainer.callbacks if isinstance(callback, EWMAReference)]
        state = {
            "group_ids": self.group_ids,
            "success": self.success,
            "task_ids": self.task_ids,
            "step_metrics": self.step_metrics,
            "ewma_average": {name: tensor.clone() for name, tensor in ewmas[0].averaged_parameters.items()}
            if ewmas
            else None,
            # Gathered whole under FSDP2 (a collective every rank joins; plain tensors pass as they are).
            "live": {
                name: tensor.detach().clone()
                for name, tensor in whole_tensors(dict(pl_module.policy.named_parameters())).items()
            },
            # What this rank itself holds: its shards under FSDP2, everything under DDP.
            "local_numel": sum(_local(parameter).numel() for parameter in pl_module.policy.parameters()),
            "world_size": trainer.world_size,
        }
        if trainer.global_rank == 0:
            state["counts"] = trainer.datamodule.rollouts.service.buffer.counts()  # rank 0 hosts the service
        self.out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(state, self.out_dir / f"rank{trainer.global_rank}.pt")


def _local(parameter: torch.Tensor) -> torch.Tensor:
    to_local = getattr(parameter, "to_local", None)
    return to_local() if callable(to_local) else parameter
