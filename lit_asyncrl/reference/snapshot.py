"""Exact pi_old from retained weight snapshots, one forward per distinct version in the batch."""

from __future__ import annotations

import lightning as L
import torch
from asyncrl_callbacks import SnapshotRetention

from lit_asyncrl.scoring import logits_to_token_logprobs


class SnapshotReference:
    """Scores every policy token under the weights of the version that sampled it.

    Args:
        max_staleness: the buffer's staleness cap (`data.max_version_gap`): every version a
            trainable token may carry stays resident.
        max_resident, max_bytes, storage_dtype: the snapshot budget (see `SnapshotRetention`).
    """

    exact = True

    def __init__(self, max_staleness: int = 3, max_resident: int | None = None, max_bytes: int | None = None, storage_dtype: str | None = None) -> None:
        self.retention = SnapshotRetention(
            max_staleness=max_staleness, module_attr="policy", max_resident=max_resident, max_bytes=max_bytes, storage_dtype=storage_dtype
        )

    def callbacks(self) -> list[L.Callback]:
        return [self.retention]

    def ref_logprobs(self, module: L.LightningModule, batch: dict, current_logprobs: torch.Tensor) -> torch.Tensor:
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]

        def score(forward, rows: torch.Tensor) -> torch.Tensor:
            logits = forward(input_ids=input_ids[rows], attention_mask=attention_mask[rows]).logits
            return logits_to_token_logprobs(logits, input_ids[rows], batch["temperature"], batch["top_k"])

        ref_logprobs = self.retention.historical_logprobs(batch["versions"], batch["loss_mask"], score, current_logprobs=current_logprobs.detach())
        # This batch is consumed: free every version no pending or in-flight token refers to.
        self.retention.release_unreferenced(module.trainer.datamodule.live_versions())
        return ref_logprobs
