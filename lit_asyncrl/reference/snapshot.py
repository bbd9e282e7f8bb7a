"""Exact pi_old from retained weight snapshots, one forward per distinct version in the batch."""

from __future__ import annotations

import lightning as L
import torch
from asyncrl_callbacks import SnapshotRetention
from lightning.pytorch.utilities import rank_zero_warn

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.models.moe_routing import BATCH_ROUTING, applied, batch_routing_of
from lit_asyncrl.reference.base import ReferenceSource
from lit_asyncrl.rollout.service import RolloutService, require_service
from lit_asyncrl.scoring import logits_to_token_logprobs


class SnapshotReference(ReferenceSource):
    """Scores every policy token under the weights of the version that sampled it.

    pi_ref is exact (`exact` is True) unless `storage_dtype` keeps the snapshots in a dtype that
    cannot hold the live weights as they are (e.g. bfloat16 or float16 for float32 weights): the
    historical forward then runs on rounded weights and pi_ref only approximates pi_old.

    Args:
        max_staleness: versions kept behind the newest; None = the rollout service's staleness cap
            (`rollout.max_version_gap`), so every version a trainable token may carry stays resident.
            A value below that cap is refused.
        max_resident, max_bytes, storage_dtype: the snapshot budget (see `SnapshotRetention`).
    """

    def __init__(
        self,
        max_staleness: int | None = None,
        max_resident: int | None = None,
        max_bytes: int | None = None,
        storage_dtype: str | None = None,
    ) -> None:
        self.max_staleness = max_staleness
        self.max_resident = max_resident
        self.max_bytes = max_bytes
        self.storage_dtype = storage_dtype
        self._retention = self.make_retention()
        self._rollouts: RolloutService | None = None
        self._warned_missing = False

    def make_retention(self) -> SnapshotRetention:
        """The callback that keeps the snapshots (a subclass may keep them elsewhere)."""
        return SnapshotRetention(
            max_staleness=self.max_staleness,
            module_attr="policy",
            max_resident=self.max_resident,
            max_bytes=self.max_bytes,
            storage_dtype=self.storage_dtype,
        )

    @property
    def retention(self) -> SnapshotRetention:
        return self._retention

    @property
    def exact(self) -> bool:  # type: ignore[override]  # a ClassVar elsewhere; here it depends on storage_dtype
        """False when the snapshots store parameters in a dtype that rounds the live weights.

        The live policy's dtypes are read once the fit has set up the retention callback; before
        that the weights are assumed float32 (the training default here).
        """
        storage = self._retention.store.storage_dtype
        if storage is None:  # the snapshots keep the training dtype
            return True
        module = self._retention.module
        live = (
            {p.dtype for p in module.parameters() if p.is_floating_point()} if module is not None else {torch.float32}
        )
        return all(_holds_exactly(storage, dtype) for dtype in live)

    def callbacks(self) -> list[L.Callback]:
        return [self._retention]

    def check_rollout_settings(self, rollouts: RolloutService) -> None:
        max_version_gap = rollouts.max_version_gap
        window = self.max_staleness if self.max_staleness is not None else max_version_gap
        if self.max_staleness is not None and self.max_staleness < max_version_gap:
            raise ValueError(
                f"reference.max_staleness={self.max_staleness} is below "
                f"{config_key('rollout.max_version_gap')}={max_version_gap}: tokens of "
                "the oldest admitted versions would have no snapshot (leave max_staleness unset to follow the cap)"
            )
        if self.max_resident is not None and self.max_resident < window + 1:
            raise ValueError(
                f"reference.max_resident={self.max_resident} cannot hold the {window + 1} versions a token may "
                f"come from (versions up to {window} behind, "
                f"{config_key('rollout.max_version_gap')}={max_version_gap}): set it >= {window + 1} or null"
            )

    def bind(self, rollouts: RolloutService | None) -> None:
        """Follow `rollouts`' staleness cap and ask it which versions are still alive."""
        rollouts = require_service(rollouts, "reference=snapshot")
        cap = rollouts.max_version_gap
        if self.max_staleness is None:
            self._retention.set_max_staleness(cap)
        elif self.max_staleness < cap:
            raise ValueError(
                f"reference max_staleness={self.max_staleness} is below "
                f"{config_key('rollout.max_version_gap')}={cap}: tokens of the "
                "oldest admitted versions would have no snapshot (leave max_staleness unset to follow the cap)"
            )
        # A checkpoint that keeps pending episodes keeps the snapshots their versions need.
        self._retention.checkpoint_snapshots = (
            self._versions_to_checkpoint if getattr(rollouts, "checkpoint_pending", False) else False
        )
        self._rollouts = rollouts

    def _versions_to_checkpoint(self) -> list[int]:
        """The versions live tokens refer to, but the newest: a checkpoint's weights are that version."""
        return [version for version in self._rollouts.live_versions() if version != self._retention.latest_version]

    def ref_logprobs(self, batch: dict, current_logprobs: torch.Tensor, version: int) -> torch.Tensor:
        ref_logprobs = self.logprobs_under(batch, batch["versions"], current_logprobs)
        # This batch is consumed: free every version no pending or in-flight token refers to.
        if self._rollouts is not None:
            self._retention.release_unreferenced(self._rollouts.live_versions())
        return ref_logprobs

    def logprobs_under(
        self, batch: dict, versions: torch.Tensor, current_logprobs: torch.Tensor, routing_of_versions: bool = True
    ) -> torch.Tensor:
        """Each policy token of `batch` scored under the snapshot of `versions` [B, T] (releases nothing).

        An MoE's batch with the engine's routing: with `routing_of_versions` each snapshot's forward follows the
        routing the engine computed under that version (the one the tokens it scores were sampled under), so
        the versions are scored one call each; otherwise every forward follows each position's newest routing,
        as the live weights' does (the policy's drift between versions under one routing)."""
        # Tokens of a version without a snapshot (restored from a checkpoint written without it, e.g.
        # before fidelity=true was added) get NaN: the loss masks and counts them (train/nonfinite_tokens).
        missing = batch["loss_mask"] & ~self._resident(versions)
        scored = batch["loss_mask"] & ~missing
        if BATCH_ROUTING in batch and routing_of_versions:
            scores = torch.zeros(versions.shape, device=versions.device)
            for version in versions[scored].unique().tolist():  # 0 outside each version's tokens
                scores += self._historical(batch, versions, scored & (versions == version), current_logprobs, version)
        else:
            scores = self._historical(batch, versions, scored, current_logprobs)
        if missing.any() and not self._warned_missing:
            self._warned_missing = True
            rank_zero_warn(
                f"reference=snapshot: tokens of versions {sorted(set(versions[missing].tolist()))} have no snapshot "
                "(restored from a checkpoint that did not keep it); their pi_old is NaN, "
                "so the loss leaves them out and counts them in train/nonfinite_tokens"
            )
        return scores.masked_fill(missing, float("nan"))

    def _historical(
        self,
        batch: dict,
        versions: torch.Tensor,
        scored: torch.Tensor,
        current_logprobs: torch.Tensor,
        routing_version: int | None = None,
    ) -> torch.Tensor:
        """The `scored` tokens under their versions' snapshots (0 elsewhere); an MoE's forwards follow the
        engine's routing under `routing_version` (None: each position's newest)."""
        input_ids = batch["input_ids"]
        attention_mask = batch["attention_mask"]

        def score(forward, rows: torch.Tensor) -> torch.Tensor:
            with applied(batch_routing_of(batch, rows, routing_version)):
                logits = forward(input_ids=input_ids[rows], attention_mask=attention_mask[rows]).logits
            return logits_to_token_logprobs(logits, input_ids[rows], batch["temperature"], batch["top_k"])

        # The module's live log-probs are scored with dropout off (`ReferenceSource.ref_logprobs`).
        return self._retention.historical_logprobs(
            versions, scored, score, current_logprobs=current_logprobs.detach(), current_logprobs_without_dropout=True
        )

    def _resident(self, versions: torch.Tensor) -> torch.Tensor:
        resident = torch.tensor(self._retention.versions, dtype=versions.dtype, device=versions.device)
        return torch.isin(versions, resident)


def _holds_exactly(storage: torch.dtype, live: torch.dtype) -> bool:
    """Whether every value of `live` survives a round trip through `storage` (precision and range)."""
    if storage == live:
        return True
    kept = torch.finfo(storage)
    original = torch.finfo(live)
    return kept.eps <= original.eps and kept.max >= original.max and kept.smallest_normal <= original.smallest_normal
