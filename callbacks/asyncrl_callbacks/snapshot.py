"""Snapshot retention: exact pi_old by scoring each token under the weights of its own version.

Paper section 5.1 ("snapshot-based version tracking") and appendix G.1. After every optimizer step the
callback copies the new version's weights to host memory; at training time it groups the policy
tokens by the version that sampled them and runs one forward per distinct version, over only the
sequences that contain it, with the snapshot's tensors swapped in by ``torch.func.functional_call``.
"""

import functools
import time
from collections.abc import Callable, Iterable
from typing import Any

import lightning.pytorch as pl
import torch
from asyncrl_callbacks.eval_mode import evaluation_mode, has_active_dropout
from asyncrl_callbacks.snapshot_store import SnapshotStore, module_tensors
from asyncrl_callbacks.version_shards import VersionShard, version_shards
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.func import functional_call
from typing_extensions import override

#: ``score_fn(forward, rows) -> [len(rows), T]`` log-probs. ``forward(*args, **kwargs)`` calls the
#: target module with the snapshot's weights; ``rows`` are the batch rows of the shard.
ScoreFn = Callable[[Callable[..., Any], Tensor], Tensor]

_GB = 1024**3
#: Per-step metrics of the historical stage, reset at each training batch.
STAGE_METRICS = (
    "snapshot/load_s",
    "snapshot/restore_s",
    "snapshot/historical_forward_s",
    "snapshot/stage_s",
    "snapshot/version_shards_per_batch",
    "snapshot/historical_shards_per_batch",
    "snapshot/max_staleness_gap",
)
#: Metrics of the store, updated at each save and release.
STORE_METRICS = ("snapshot/size_gb", "snapshot/resident", "snapshot/resident_gb", "snapshot/save_s")


class SnapshotRetention(Callback):
    r"""Keep each recent weight version on the host and score tokens under their own version.

    Version ``v`` is the weights after ``v`` optimizer steps (``trainer.global_step``); version 0 is
    saved at ``on_train_start``, version ``v`` right after the step that made it. Saving ``v`` drops
    the versions older than ``v - max_staleness``; the training code releases the others as soon as
    no queued token refers to them (:meth:`release_unreferenced`).

    Args:
        max_staleness: Largest version gap a trained token may have (the buffer's staleness cap);
            None = set later with :meth:`set_max_staleness`, before training starts.
        module_attr: Dotted attribute of the LightningModule holding the scored module (e.g.
            ``"policy"``); ``None`` snapshots the whole LightningModule.
        max_resident: Most snapshots kept at once; must be ``>= max_staleness + 1``.
        max_bytes: Most bytes of snapshots kept at once; checked against ``max_staleness + 1``
            snapshots when the first one is saved, before the first step.
        storage_dtype: Host dtype of floating-point parameters (``torch.bfloat16`` or ``"bfloat16"``
            halves memory but makes pi_old approximate). ``None`` keeps the training dtype (exact).
        pin_memory: Pinned host memory for weights that live on CUDA.
        checkpoint_snapshots: Also write the snapshots into checkpoints: ``True`` every resident
            one, or a callable returning the versions to write (e.g. those that stored rollouts
            still need; the newest is the checkpoint's own weights and is saved again at the
            resume). Off by default: they are up to ``max_staleness + 1`` copies of the model.
            Without them a resumed run only has the resumed version, so the training code must
            drop tokens whose version is gone (:meth:`has_version`).
        log_metrics: Log ``snapshot/*`` metrics at each training batch end (they are also kept in
            :attr:`metrics`).
        keep: ``"trainable"`` (default): a snapshot copies the parameters that require a gradient
            (and the buffers); frozen ones (frozen layers, the base weights under a LoRA adapter)
            are read from the live module, checked unwritten since the save. ``"all"``: every
            parameter.

    Example::

        snapshots = SnapshotRetention(max_staleness=4, module_attr="policy")
        trainer = Trainer(callbacks=[snapshots])


        # LightningModule.training_step
        def score(forward, rows):  # forward runs self.policy with the snapshot's weights
            logits = forward(batch.input_ids[rows]).logits / temperature
            return logits.log_softmax(-1).gather(-1, batch.targets[rows, :, None]).squeeze(-1)


        ref_logprobs = snapshots.historical_logprobs(batch.token_versions, batch.loss_mask, score)
        ...
        snapshots.release_unreferenced(buffer.referenced_versions())
    """

    def __init__(
        self,
        max_staleness: int | None,
        module_attr: str | None = None,
        max_resident: int | None = None,
        max_bytes: int | None = None,
        storage_dtype: torch.dtype | str | None = None,
        pin_memory: bool = True,
        checkpoint_snapshots: bool | Callable[[], Iterable[int]] = False,
        log_metrics: bool = True,
        keep: str = "trainable",
    ) -> None:
        self.store = SnapshotStore(max_staleness, max_resident, max_bytes, storage_dtype, pin_memory, keep)
        self.module_attr = module_attr
        self.checkpoint_snapshots = checkpoint_snapshots
        self.log_metrics = log_metrics
        self.metrics: dict[str, float] = dict.fromkeys(STORE_METRICS + STAGE_METRICS, 0.0)
        self.num_saved = 0
        self.num_released = 0
        self.num_historical_forwards = 0
        self.latest_version: int | None = None
        self._module: nn.Module | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(module_attr=self.module_attr, max_staleness=self.store.max_staleness)

    def set_max_staleness(self, max_staleness: int) -> None:
        """Set the window when it comes from elsewhere (``max_staleness=None`` at construction).

        Call before training starts (e.g. in another callback's ``setup``), once the rollout side's
        staleness cap is known.
        """
        self.store.set_max_staleness(max_staleness)

    @property
    def versions(self) -> tuple[int, ...]:
        """Resident versions, oldest first."""
        return self.store.versions

    @property
    def module(self) -> nn.Module | None:
        """The module whose weights are snapshotted, once ``setup`` has resolved it; None before."""
        return self._module

    @property
    def resident_bytes(self) -> int:
        """Bytes held by the resident snapshots."""
        return self.store.resident_bytes

    def has_version(self, version: int) -> bool:
        """Whether tokens sampled by ``version`` can still be scored."""
        return version in self.store

    # ----------------------------------------------------------------------------------- hooks

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        """Resolve the module to snapshot."""
        self._module = _resolve_module(pl_module, self.module_attr)

    @override
    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Save the starting version (0, or the resumed ``global_step``)."""
        # Not on_fit_start: a resumed global_step is only restored after that hook.
        self.save_version(trainer.global_step)

    @override
    def on_train_batch_start(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, batch_idx: int
    ) -> None:
        """Start this batch's stage metrics from zero."""
        self.metrics.update(dict.fromkeys(STAGE_METRICS, 0.0))

    @override
    def on_train_batch_end(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Save the version the optimizer step just made, then log the metrics."""
        # With gradient accumulation (or a skipped step) global_step has not moved: nothing new.
        if trainer.global_step != self.latest_version:
            self.save_version(trainer.global_step)
        if self.log_metrics:
            pl_module.log_dict(self.metrics, on_step=True, on_epoch=False, batch_size=1)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "num_saved": self.num_saved,
            "num_released": self.num_released,
            "num_historical_forwards": self.num_historical_forwards,
            "latest_version": self.latest_version,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.num_saved = state_dict.get("num_saved", 0)
        self.num_released = state_dict.get("num_released", 0)
        self.num_historical_forwards = state_dict.get("num_historical_forwards", 0)
        self.latest_version = state_dict.get("latest_version")

    @override
    def on_save_checkpoint(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", checkpoint: dict[str, Any]
    ) -> None:
        """Write the snapshots when ``checkpoint_snapshots`` is set (those it names, when a callable)."""
        if self.checkpoint_snapshots:
            wanted = (
                set(self.checkpoint_snapshots()) if callable(self.checkpoint_snapshots) else set(self.store.versions)
            )
            checkpoint[self._checkpoint_key] = {v: self.store.get(v) for v in self.store.versions if v in wanted}

    @override
    def on_load_checkpoint(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", checkpoint: dict[str, Any]
    ) -> None:
        """Read the snapshots back; a checkpoint without them leaves only the resumed version."""
        snapshots = checkpoint.get(self._checkpoint_key)
        if snapshots is None:
            if self.checkpoint_snapshots:
                rank_zero_warn(
                    "SnapshotRetention: the checkpoint holds no snapshots; tokens sampled before the "
                    "resume cannot be scored (check has_version and drop them)."
                )
            return
        for version, tensors in snapshots.items():
            self.store.put(int(version), tensors)
        self._record_resident()

    # ------------------------------------------------------------------------------ public API

    def save_version(self, version: int, module: nn.Module | None = None) -> None:
        """Copy the module's current weights as ``version`` (the hooks call this for you).

        Args:
            version: The weight version the module holds now.
            module: Module to snapshot; also becomes the target for later calls. Defaults to the
                module resolved at ``setup``.
        """
        if module is not None:
            self._module = module
        start = time.perf_counter()
        nbytes = self.store.save(self._target(), version)
        self.metrics["snapshot/save_s"] = time.perf_counter() - start
        self.metrics["snapshot/size_gb"] = nbytes / _GB
        self.latest_version = version
        self.num_saved += 1
        self._record_resident()

    def release_unreferenced(self, live_versions: Iterable[int]) -> list[int]:
        """Drop the snapshots no pending token refers to.

        Call it after each training step with every version that a not-yet-trained token carries:
        the buffer's queued samples *and* the engine's in-flight partial episodes. The newest
        version is always kept (the engine samples with it).

        Returns:
            The released versions.
        """
        released = self.store.release_unreferenced(live_versions)
        self.num_released += len(released)
        self._record_resident()
        return released

    def historical_logprobs(
        self,
        token_versions: Tensor,
        loss_mask: Tensor,
        score_fn: ScoreFn,
        current_logprobs: Tensor | None = None,
        module: nn.Module | None = None,
        current_logprobs_without_dropout: bool = False,
    ) -> Tensor:
        """pi_old of every policy token under the weights of the version that sampled it.

        Runs one forward per distinct version among the masked tokens, over only the rows holding
        that version, under ``torch.no_grad`` and in eval mode (no dropout: pi_old is the policy
        itself); the module's train/eval mode is back as it was afterwards.

        Args:
            token_versions: Long ``[B, T]``: version that sampled each token.
            loss_mask: Bool ``[B, T]``: policy tokens.
            score_fn: ``score_fn(forward, rows) -> [len(rows), T]`` log-probs, where
                ``forward(*args, **kwargs)`` calls the target module with the snapshot's tensors and
                ``rows`` (long, on the batch's device) selects the shard's sequences. Apply the
                sampling temperature here.
            current_logprobs: Optional ``[B, T]`` log-probs of the live weights, which inside
                ``training_step`` are the newest saved version. That version's tokens take them
                (detached) instead of a forward only when the module has no active dropout
                (:func:`~asyncrl_callbacks.eval_mode.has_active_dropout`), so that they are the
                eval-mode log-probs; otherwise those tokens get an eval-mode forward of the live
                weights, like every other version's.
            module: Module to call; defaults to the one resolved at ``setup``.
            current_logprobs_without_dropout: ``current_logprobs`` come from a forward without
                dropout (the caller scored the live weights in eval mode): taken as they are even
                when the module has active dropout, so that version costs no second forward.

        Returns:
            ``[B, T]`` log-probs; positions outside ``loss_mask`` are 0.

        Raises:
            KeyError: A masked token's version has no resident snapshot (names it and the resident ones).
        """
        module = self._target(module)
        start = time.perf_counter()
        shards = version_shards(token_versions, loss_mask)
        for shard in shards:  # fail before any forward
            self.store.get(shard.version)
        out = torch.zeros(token_versions.shape, device=token_versions.device)
        for shard in shards:
            values = self._shard_logprobs(shard, module, score_fn, current_logprobs, current_logprobs_without_dropout)
            out = out.to(values.device, values.dtype)  # follow the scores' device and precision
            rows = shard.rows.to(out.device)
            out[rows] = torch.where(shard.token_mask.to(out.device), values, out[rows])
        _synchronize(out.device)
        self._record_stage(shards, time.perf_counter() - start)
        return out

    # ------------------------------------------------------------------------------- internals

    def _shard_logprobs(
        self,
        shard: VersionShard,
        module: nn.Module,
        score_fn: ScoreFn,
        current_logprobs: Tensor | None,
        current_logprobs_without_dropout: bool,
    ) -> Tensor:
        if current_logprobs is not None and shard.version == self.latest_version:
            # The caller's forward is the eval-mode one (it says so, or there is no dropout): no forward.
            if current_logprobs_without_dropout or not has_active_dropout(module):
                return current_logprobs.detach()[shard.rows.to(current_logprobs.device)]
            # The caller's log-probs are a dropout sample: score the live weights, which are this version
            # (the caller says so by passing them; exact even with a rounded storage_dtype), in eval mode.
            forward: Callable[..., Any] = module
        else:
            forward = _bind(module, self._materialise(shard.version, module))
        start = time.perf_counter()
        with torch.no_grad(), evaluation_mode(module):
            values = score_fn(forward, shard.rows)
        _synchronize(values.device)
        self.metrics["snapshot/historical_forward_s"] += time.perf_counter() - start
        self.num_historical_forwards += 1
        expected = tuple(shard.token_mask.shape)
        if tuple(values.shape) != expected:
            raise ValueError(
                f"score_fn returned shape {tuple(values.shape)} for version {shard.version}, expected {expected}"
            )
        return values

    def _materialise(self, version: int, module: nn.Module) -> dict[str, Tensor]:
        """Host snapshot -> tensors on the live devices (load) in the live dtypes (restore)."""
        host = self.store.get(version)
        live = module_tensors(module)
        shared = self.store.shared_tensors(version, module)  # frozen: read from the live module
        _check_same_names(version, host, {name: t for name, t in live.items() if name not in shared})
        start = time.perf_counter()
        moved = {name: t.to(live[name].device, non_blocking=t.is_pinned()) for name, t in host.items()}
        devices = {t.device for t in live.values()}
        _synchronize(*devices)
        if any(d.type != "cpu" for d in devices):  # on CPU nothing moves: load time is 0
            self.metrics["snapshot/load_s"] += time.perf_counter() - start
        start = time.perf_counter()
        params = {**shared, **{name: t.to(live[name].dtype) for name, t in moved.items()}}  # no copy when equal
        _synchronize(*devices)
        self.metrics["snapshot/restore_s"] += time.perf_counter() - start
        return params

    def _record_stage(self, shards: list[VersionShard], seconds: float) -> None:
        historical = [s for s in shards if s.version != self.latest_version]
        gap = self.latest_version - shards[0].version if shards and self.latest_version is not None else 0
        self.metrics["snapshot/stage_s"] += seconds
        self.metrics["snapshot/version_shards_per_batch"] += len(shards)
        self.metrics["snapshot/historical_shards_per_batch"] += len(historical)
        self.metrics["snapshot/max_staleness_gap"] = float(max(self.metrics["snapshot/max_staleness_gap"], gap))

    def _record_resident(self) -> None:
        self.metrics["snapshot/resident"] = float(len(self.store))
        self.metrics["snapshot/resident_gb"] = self.store.resident_bytes / _GB

    def _target(self, module: nn.Module | None = None) -> nn.Module:
        target = module if module is not None else self._module
        if target is None:
            raise RuntimeError("SnapshotRetention has no module: add it to a Trainer or pass module=...")
        return target

    @property
    def _checkpoint_key(self) -> str:
        return f"snapshots/{self.state_key}"


def _bind(module: nn.Module, params: dict[str, Tensor]) -> Callable[..., Any]:
    """``module(*args, **kwargs)`` with ``params`` in place of its own tensors (no copy into it)."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        return functional_call(module, params, args, kwargs, strict=True)

    return forward


def _resolve_module(pl_module: nn.Module, module_attr: str | None) -> nn.Module:
    if module_attr is None:
        return pl_module
    try:
        module = functools.reduce(getattr, module_attr.split("."), pl_module)
    except AttributeError as err:
        raise AttributeError(f"module_attr={module_attr!r}: {type(pl_module).__name__} has no such attribute") from err
    if not isinstance(module, nn.Module):
        raise TypeError(f"module_attr={module_attr!r} is a {type(module).__name__}, not an nn.Module")
    return module


def _check_same_names(version: int, host: dict[str, Tensor], live: dict[str, Tensor]) -> None:
    # functional_call would otherwise fall back to a live tensor for a name the snapshot lacks.
    if host.keys() != live.keys():
        missing = sorted(live.keys() - host.keys())
        extra = sorted(host.keys() - live.keys())
        raise ValueError(
            f"snapshot of version {version} does not match the module: missing {missing}, unexpected {extra}"
        )


def _synchronize(*devices: torch.device) -> None:
    # CUDA work is asynchronous: wait for it so that the timings measure the work itself.
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
