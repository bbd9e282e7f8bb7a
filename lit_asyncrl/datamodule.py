"""The LightningDataModule: a thin adapter that streams a rollout service's [B, T] batches."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from lit_asyncrl.envs import Environment, GuessNumberEnv
from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.rollout.engine import EngineConfig
from lit_asyncrl.rollout.service import RolloutService
from lit_asyncrl.rollout.vllm_service import VLLMRolloutService


class RolloutDataModule(L.LightningDataModule):
    """A thin Lightning adapter around a `RolloutService`: its batches as a training stream.

    The service does the work (engine, producer, buffer, dedicated old-logit worker); this class
    builds it from config keys, closes it on every way out of a fit (teardown, exception, Ctrl-C)
    and hands it to the callbacks that need it as `rollouts`. The batch schema is documented in
    `lit_asyncrl.rollout.service`.

    Args:
        model_path: local Hugging Face model folder the engine serves; None = built-in tiny policy.
        env: the task (None = guess-the-number).
        group_size ... top_k, seed: the rollout settings, documented on `VLLMRolloutService`.
        dtype, max_model_len, kv_cache_fraction: engine settings (`EngineConfig`).
        engine_log_level: vLLM's log level ("ERROR" hides its per-push lines; "INFO" shows all).
        batch_timeout_s: how long the trainer waits for a batch before failing loudly.
    """

    def __init__(
        self,
        model_path: str | None = None,
        env: Environment | None = None,
        group_size: int = 8,
        groups_per_batch: int = 16,
        max_version_gap: int = 3,
        buffer_capacity: int = 256,
        max_concurrent_groups: int = 16,
        mode: Literal["async", "sync"] = "async",
        weight_sync_every: int = 1,
        temperature: float = 1.0,
        top_k: int = -1,
        dtype: str = "float32",
        max_model_len: int = 256,
        kv_cache_fraction: float = 0.2,
        engine_log_level: str = "ERROR",
        seed: int = 0,
        batch_timeout_s: float = 600.0,
    ) -> None:
        super().__init__()
        _validate(group_size, groups_per_batch, max_version_gap, buffer_capacity, mode, weight_sync_every, temperature, engine_log_level)
        # Resolve (and for the tiny policy, build) the model folder now: a bad path fails here,
        # before any engine starts.
        self.model_path = resolve_model_path(model_path)
        self.env = env if env is not None else GuessNumberEnv()
        self.batch_timeout_s = batch_timeout_s
        engine_config = EngineConfig(
            dtype=dtype, max_model_len=max_model_len, kv_cache_fraction=kv_cache_fraction, seed=seed, log_level=engine_log_level
        )
        self.rollouts: RolloutService = VLLMRolloutService(
            self.model_path,
            self.env,
            group_size=group_size,
            groups_per_batch=groups_per_batch,
            max_version_gap=max_version_gap,
            buffer_capacity=buffer_capacity,
            max_concurrent_groups=max_concurrent_groups,
            mode=mode,
            weight_sync_every=weight_sync_every,
            temperature=temperature,
            top_k=top_k,
            engine_config=engine_config,
            seed=seed,
        )

    def train_dataloader(self) -> DataLoader:
        # batch_size=None: the dataset yields whole collated batches; workers must stay in-process.
        return DataLoader(_ServiceStream(self.rollouts, self.batch_timeout_s), batch_size=None, num_workers=0)

    def teardown(self, stage: str) -> None:
        self.rollouts.close()

    def on_exception(self, exception: BaseException) -> None:
        # Lightning skips `teardown` when fit raises (or is interrupted): close here too.
        self.rollouts.close()


class _ServiceStream(IterableDataset):
    def __init__(self, rollouts: RolloutService, timeout_s: float) -> None:
        self.rollouts, self.timeout_s = rollouts, timeout_s

    def __iter__(self) -> Iterator[dict]:
        while True:
            yield self.rollouts.next_batch(self.timeout_s)


def _validate(
    group_size, groups_per_batch, max_version_gap, buffer_capacity, mode, weight_sync_every, temperature, engine_log_level
) -> None:
    if group_size < 1:
        raise ValueError(f"data.group_size must be >= 1, got {group_size}")
    if groups_per_batch < 1:
        raise ValueError(f"data.groups_per_batch must be >= 1, got {groups_per_batch}")
    if max_version_gap < 0:
        raise ValueError(f"data.max_version_gap must be >= 0, got {max_version_gap}")
    if group_size * groups_per_batch > buffer_capacity:
        raise ValueError(
            f"data.buffer_capacity={buffer_capacity} is smaller than one batch "
            f"(data.groups_per_batch * data.group_size = {groups_per_batch * group_size} episodes)"
        )
    if mode not in ("async", "sync"):
        raise ValueError(f"data.mode must be 'async' or 'sync', got {mode!r}")
    if weight_sync_every < 1:
        raise ValueError(f"data.weight_sync_every must be >= 1, got {weight_sync_every}")
    if mode == "sync" and weight_sync_every != 1:
        raise ValueError("data.mode='sync' needs data.weight_sync_every=1 (each batch from the latest weights)")
    if temperature <= 0:
        raise ValueError(f"data.temperature must be > 0, got {temperature}")
    levels = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
    if str(engine_log_level).upper() not in levels:
        raise ValueError(f"data.engine_log_level must be one of {levels}, got {engine_log_level!r}")
