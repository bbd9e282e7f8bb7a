"""The LightningDataModule: owns the engine, the producer and the buffer; streams [B, T] batches."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Literal

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lit_asyncrl.envs import Environment, GuessNumberEnv
from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.rollout.buffer import RolloutBuffer
from lit_asyncrl.rollout.dedicated import DedicatedOldLogitModel
from lit_asyncrl.rollout.engine import EngineConfig, VLLMEngine
from lit_asyncrl.rollout.old_logits import attach, collect_unscored, score_requests
from lit_asyncrl.rollout.producer import RolloutProducer
from lit_asyncrl.rollout.records import collate


class RolloutDataModule(L.LightningDataModule):
    """Rollouts from a background vLLM engine, as a stream of training batches.

    Args:
        model_path: local Hugging Face model folder the engine serves; None = built-in tiny policy.
        env: the task; episodes of one instance form a group of `group_size` (GRPO advantages).
        groups_per_batch: groups per training batch (B = groups_per_batch * group_size episodes).
        max_version_gap: groups with a token more than this many versions behind are dropped.
        buffer_capacity: most episodes pending or being generated; the engine waits beyond it.
        max_concurrent_groups: groups generated at once.
        mode: "async" (generation never waits for training) or "sync" (one batch per version).
        weight_sync_every: push weights to the engine every this many optimizer steps.
        temperature, top_k: sampling; the trainer scores with the same values (they ride in the batch).
        dtype, max_model_len, kv_cache_fraction: engine settings.
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
        seed: int = 0,
        batch_timeout_s: float = 600.0,
    ) -> None:
        super().__init__()
        _validate(group_size, groups_per_batch, max_version_gap, buffer_capacity, mode, weight_sync_every, temperature)
        # Resolve (and for the tiny policy, build) the model folder now: a bad path fails here,
        # before any engine starts.
        self.model_path = resolve_model_path(model_path)
        self.env = env if env is not None else GuessNumberEnv()
        self.group_size, self.groups_per_batch = group_size, groups_per_batch
        self.max_version_gap, self.buffer_capacity = max_version_gap, buffer_capacity
        self.max_concurrent_groups, self.mode = max_concurrent_groups, mode
        self.weight_sync_every = weight_sync_every
        self.temperature, self.top_k = temperature, top_k
        self.engine_config = EngineConfig(dtype=dtype, max_model_len=max_model_len, kv_cache_fraction=kv_cache_fraction, seed=seed)
        self.seed, self.batch_timeout_s = seed, batch_timeout_s
        self.engine: VLLMEngine | None = None
        self.producer: RolloutProducer | None = None
        self.dedicated: DedicatedOldLogitModel | None = None
        self._dedicated_requested = False
        self.buffer = RolloutBuffer(buffer_capacity, max_version_gap)
        self.tokenizer = None

    def setup(self, stage: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        if self.engine is None:
            self.engine = VLLMEngine(self.model_path, self.engine_config)
            self.engine.start()

    def use_dedicated_old_logit_model(self) -> None:
        """Score pi_old in a dedicated worker process (requested by `reference=dedicated`)."""
        self._dedicated_requested = True

    def start_rollouts(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load the trainer's weights as `version` and start generating (called at train start)."""
        if self.engine is None:
            raise RuntimeError("setup() must run before start_rollouts()")
        if self._dedicated_requested and self.dedicated is None:
            self.dedicated = DedicatedOldLogitModel(self.model_path, temperature=self.temperature, top_k=self.top_k, pad_id=self.tokenizer.pad_token_id)
            self.dedicated.start(self.engine.loop)
            self.dedicated.send_weights(state_dict, version)
        self.engine.push_weights(state_dict, version)
        self.buffer.set_trainer_version(version)
        self.producer = RolloutProducer(
            self.engine, self.env, self.tokenizer, self.buffer,
            group_size=self.group_size,
            max_concurrent_groups=self.max_concurrent_groups,
            temperature=self.temperature,
            top_k=self.top_k,
            max_context=self.engine_config.max_model_len,
            seed=self.seed,
            groups_per_version=self.groups_per_batch if self.mode == "sync" else None,
            old_logit_model=self.dedicated,
        )
        self.producer.start()

    def push_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> dict[str, float]:
        """Move the engine (and the dedicated old-logit worker) to `version`."""
        if self.dedicated is not None:
            # While paused, hand the worker every token of the outgoing version still unscored
            # (partial turns included); the worker scores them before it loads `version`.
            self.engine.pause()

            async def submit_outgoing():
                self.dedicated.submit(self._unfinished_trajectories())

            self.engine.run(submit_outgoing())
            self.dedicated.send_weights(state_dict, version)
        return self.engine.push_weights(state_dict, version)

    def train_dataloader(self) -> DataLoader:
        # batch_size=None: the dataset yields whole collated batches; workers must stay in-process.
        return DataLoader(_BufferStream(self), batch_size=None, num_workers=0)

    def next_batch(self) -> dict[str, torch.Tensor | float]:
        """Block until a batch of fresh groups is ready; fail loudly if the engine died."""
        deadline = time.monotonic() + self.batch_timeout_s
        while True:
            if self.producer is not None and self.producer.error is not None:
                raise RuntimeError("rollout generation failed") from self.producer.error
            try:
                groups = self.buffer.take(self.groups_per_batch, timeout_s=min(5.0, max(deadline - time.monotonic(), 0.0)))
                break
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
        batch = collate([t for group in groups for t in group], pad_id=self.tokenizer.pad_token_id)
        batch["temperature"] = self.temperature
        batch["top_k"] = self.top_k
        batch.update(self.rollout_stats())
        return batch

    def rollout_stats(self) -> dict[str, float]:
        """Queue, accounting (produced = trained + dropped + pending) and throughput, as floats."""
        producer = self.producer
        stats = {f"rollout/{key}": float(value) for key, value in self.buffer.counts().items()}
        stats["rollout/queue_depth"] = stats["rollout/pending"]
        stats["rollout/in_flight_groups"] = float(producer.in_flight_groups if producer else 0)
        stats["rollout/tokens_per_s"] = float(producer.tokens_per_s if producer else 0.0)
        if self.dedicated is not None:
            stats["dedicated/queue_depth"] = float(self.dedicated.queue_depth)
            stats["dedicated/scored_tokens"] = float(self.dedicated.scored_tokens)
            stats["dedicated/score_s"] = self.dedicated.score_seconds
            stats["dedicated/group_wait_s"] = producer.scoring_wait_s if producer else 0.0
        return stats

    # -- interruption-sync (asyncrl_callbacks.InterruptibleRollouts) ----------------------------
    def pause_rollouts(self) -> None:
        self.engine.pause()

    def resume_rollouts(self) -> None:
        self.engine.resume()

    def score_unscored(self, pl_module: L.LightningModule, version: int) -> int:
        """Score every token still lacking pi_old, finished or partial, with `pl_module.policy`.

        Called while generation is paused, right before the optimizer step replaces `version`:
        every unscored token was sampled under it. Collection and attachment run on the engine
        loop, which owns the trajectories; the forward runs here, on the trainer's weights.
        """
        async def collect():
            return collect_unscored(self._unfinished_trajectories())

        requests = self.engine.run(collect())
        scores = score_requests(pl_module.policy, requests, temperature=self.temperature, top_k=self.top_k, pad_id=self.tokenizer.pad_token_id)

        async def write_back():
            return attach(requests, scores, version)

        return self.engine.run(write_back())

    def _unfinished_trajectories(self) -> list:
        pending = self.buffer.pending_trajectories()
        return pending + list(self.producer.active if self.producer else ())

    def live_versions(self) -> list[int]:
        """Weight versions that a token not yet trained on may carry (pending or being generated)."""
        newest = max(self.buffer.trainer_version, self.engine.version if self.engine else 0)
        in_flight = self.producer.oldest_in_flight_version if self.producer else None
        candidates = [v for v in (self.buffer.oldest_pending_version(), in_flight) if v is not None]
        return list(range(min(candidates, default=newest), newest + 1))

    def teardown(self, stage: str) -> None:
        if self.producer is not None:
            self.producer.stop()
            self.producer = None
        if self.dedicated is not None:
            self.dedicated.stop()
            self.dedicated = None
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


class _BufferStream(IterableDataset):
    def __init__(self, datamodule: RolloutDataModule) -> None:
        self.datamodule = datamodule

    def __iter__(self) -> Iterator[dict]:
        while True:
            yield self.datamodule.next_batch()


def _validate(group_size, groups_per_batch, max_version_gap, buffer_capacity, mode, weight_sync_every, temperature) -> None:
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
