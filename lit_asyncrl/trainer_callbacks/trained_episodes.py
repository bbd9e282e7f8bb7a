"""Writes the episodes each optimizer step trains on, one JSON line per episode, to read back later.

What the policy was trained on, token by token: to inspect a run's rollouts, and to check that an
episode kept across a resume was trained with the tokens, versions and mu it was generated with.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from typing_extensions import override

#: The batch columns written for each episode, cut to its own length (a batch is right-padded).
TOKEN_COLUMNS = ("input_ids", "loss_mask", "versions", "behavior_logprobs")
EPISODE_COLUMNS = ("group_ids", "rewards", "success")


class TrainedEpisodesWriter(L.Callback):
    """`<dirpath>/step=<N>.jsonl` (`step=<N>.rank=<R>.jsonl` under several training processes): one line
    per episode trained at step N (the `step` of metrics.csv; every micro-batch of the step under gradient
    accumulation), with its group id, reward, success, token ids, loss mask (the policy's tokens),
    per-token versions and behaviour log-probs mu (0 off the policy's tokens; versions there are -1), and a
    mixture's task name.

    Written at the end of each batch: a module that pulls its own batch in `training_step` (as
    `AsyncRLModule` does) has none when the batch starts, and Lightning hands it to this hook.

    Args:
        dirpath: the folder the files go to (made when the first batch comes).
        enabled: false writes nothing (the configs carry the callback either way).
    """

    def __init__(self, dirpath: str | Path, enabled: bool = True) -> None:
        self.dirpath = Path(dirpath)
        self.enabled = enabled
        self._step = 0
        self._written_step: int | None = None  # the step whose file this process last wrote

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        # The step the batch is trained at (the optimizer moves it before the hook below).
        self._step = trainer.global_step

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self.enabled or batch is None:
            return
        self.dirpath.mkdir(parents=True, exist_ok=True)
        suffix = f".rank={trainer.global_rank}" if trainer.world_size > 1 else ""
        path = self.dirpath / f"step={self._step}{suffix}.jsonl"
        # A step's first micro-batch starts its file (a resumed run writes its steps anew); the others add to it.
        kept = path.read_text() if self._written_step == self._step and path.exists() else ""
        lines = "".join(json.dumps(row) + "\n" for row in episodes(batch, self._step))
        # Written whole, then renamed: a run killed meanwhile leaves the previous file, never half a line.
        partial = path.with_name(path.name + ".partial")
        partial.write_text(kept + lines)
        os.replace(partial, path)
        self._written_step = self._step


def episodes(batch: dict, step: int) -> list[dict]:
    """The batch's episodes as plain values, each cut to its own length."""
    lengths = batch["attention_mask"].sum(-1).tolist()
    columns = {name: batch[name].detach().cpu() for name in TOKEN_COLUMNS + EPISODE_COLUMNS}
    rows = []
    for index, length in enumerate(lengths):
        row = {"step": step, "group_id": int(columns["group_ids"][index])}
        row["reward"] = float(columns["rewards"][index])
        row["success"] = float(columns["success"][index])
        if "task_ids" in batch:
            row["task"] = batch["task_names"][int(batch["task_ids"][index])]
        for name in TOKEN_COLUMNS:
            values = columns[name][index, :length]
            row[name] = values.to(torch.int64 if values.dtype == torch.bool else values.dtype).tolist()
        rows.append(row)
    return rows
