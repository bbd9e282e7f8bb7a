"""The LightningDataModule: a thin adapter that streams a rollout service's [B, T] batches."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator
from typing import Literal

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.envs import Environment, GuessNumberEnv
from lit_asyncrl.lifecycle import Terminated, end_other_ranks
from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.rollout.dedicated import ProcessWorker
from lit_asyncrl.rollout.engine import VLLMEngine
from lit_asyncrl.rollout.engine_config import EngineConfig, parallelism_args
from lit_asyncrl.rollout.service import RolloutService
from lit_asyncrl.rollout.vllm_service import VLLMRolloutService
from lit_asyncrl.rollout.weight_transfer import select_weight_transfer


class RolloutDataModule(L.LightningDataModule):
    """A thin Lightning adapter around a `RolloutService`: its batches as a training stream.

    The service does the work (engine, producer, buffer, dedicated old-logit worker); this class
    builds it from config keys, closes it on every way out of a fit (teardown, exception, Ctrl-C)
    and hands it to the callbacks that need it as `rollouts`. The batch schema is documented in
    `lit_asyncrl.rollout.service`.

    Args:
        model_path: the model the engine serves: a local Hugging Face folder, a hub id (fetched when
            online), "smollm2_135m" (a real chat model, offline) or None (the built-in tiny policy).
        env: the task (None = guess-the-number).
        group_size ... top_k, seed: the rollout settings, documented on `VLLMRolloutService`.
        dtype, max_model_len, kv_cache_fraction: engine settings (`EngineConfig`).
        kv_cache_gib: each engine's KV cache in GiB; when set, used instead of `kv_cache_fraction`.
        engine_log_level: vLLM's log level ("ERROR" hides its per-push lines; "INFO" shows all).
        batch_timeout_s: how long the trainer waits for a batch before failing loudly.
        eval_instances: held-out instances per validation (fewer if the task's held-out split is
            smaller; guess-the-number holds out 2 secrets). They never appear in training.
        eval_samples: sampled episodes per held-out instance (n); one greedy episode is added.
        eval_k: the k of avg@k and pass@k (pass@k uses the unbiased estimator from n >= k samples).
        eval_timeout_s: most seconds one validation chunk may take.
        env_failure_limit, env_failure_window: an episode the environment fails (a call raises, an
            answer is malformed) is dropped with that reason and training goes on; when more than
            `env_failure_limit` of the last `env_failure_window` episodes failed (timeouts included),
            the run stops with the counts and the last error.
        engine_stall_timeout_s: an engine with requests in flight that streams nothing for this
            long (outside a weight push or pause) is reported as stopped answering and the run stops.
        engine_restarts: how many times a dead or stalled engine is replaced by a new one serving
            the latest weights and version (its episodes in flight counted as dropped "lost")
            before the run stops instead; 0 = stop at once. Not with the dedicated old-logit worker.
        num_engines: vLLM engines generating side by side; a new group goes to the least loaded one
            and every version is pushed to each (see docs/scaling.md).
        placement: "local" (engines and the dedicated old-logit worker started by this process) or
            "ray" (each of them a Ray actor; needs the `ray` extra).
        ray_address: the Ray cluster to join ("auto", "ray://host:10001"); None starts a local Ray
            instance for the run.
        ray_cpus_per_engine, ray_gpus_per_engine: each actor's Ray resource request (the engines'
            and the old-logit worker's; fractions share a core or a GPU).
        tensor_parallel_size, data_parallel_size: vLLM's tensor and data parallelism inside each
            engine (GPUs only; passed through to vLLM).
        weight_transfer: how weights reach the engines: "file", "gloo", "nccl", "ipc" or "auto"
            (`lit_asyncrl.rollout.weight_transfer.select_weight_transfer`).
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
        kv_cache_gib: float | None = None,
        engine_log_level: str = "ERROR",
        seed: int = 0,
        batch_timeout_s: float = 600.0,
        eval_instances: int = 32,
        eval_samples: int = 8,
        eval_k: int = 4,
        eval_timeout_s: float = 600.0,
        env_failure_limit: float = 0.5,
        env_failure_window: int = 64,
        engine_stall_timeout_s: float = 120.0,
        engine_restarts: int = 0,
        num_engines: int = 1,
        placement: Literal["local", "ray"] = "local",
        ray_address: str | None = None,
        ray_cpus_per_engine: float = 1.0,
        ray_gpus_per_engine: float = 0.0,
        tensor_parallel_size: int = 1,
        data_parallel_size: int = 1,
        weight_transfer: str = "auto",
    ) -> None:
        super().__init__()
        _validate(group_size, groups_per_batch, max_version_gap, buffer_capacity, mode, weight_sync_every, temperature, engine_log_level)
        _validate_eval(eval_instances, eval_samples, eval_k)
        _validate_engine(dtype, max_model_len, kv_cache_fraction, max_concurrent_groups, top_k)
        if kv_cache_gib is not None and not kv_cache_gib > 0:
            raise ValueError(f"{config_key('data.kv_cache_gib')} must be > 0 or null, got {kv_cache_gib}")
        if not 0.0 <= env_failure_limit <= 1.0:
            raise ValueError(f"{config_key('data.env_failure_limit')} must be in [0, 1], got {env_failure_limit}")
        _require_int("env_failure_window", env_failure_window, 1)
        _require_int("engine_restarts", engine_restarts, 0)
        if not engine_stall_timeout_s > 0:
            raise ValueError(f"{config_key('data.engine_stall_timeout_s')} must be > 0, got {engine_stall_timeout_s}")
        # Resolve (and for the tiny policy, build) the model folder now: a bad path fails here,
        # before any engine starts.
        self.model_path = resolve_model_path(model_path)
        self.env = env if env is not None else GuessNumberEnv()
        self.batch_timeout_s = batch_timeout_s
        self.eval_instances = self.env.held_out_instances(eval_instances, seed=seed)
        self.eval_samples, self.eval_k, self.eval_timeout_s = eval_samples, eval_k, eval_timeout_s
        engine_config = EngineConfig(
            dtype=dtype,
            max_model_len=max_model_len,
            kv_cache_fraction=kv_cache_fraction,
            kv_cache_bytes=None if kv_cache_gib is None else int(kv_cache_gib * 2**30),
            seed=seed,
            log_level=engine_log_level,
            stall_timeout_s=engine_stall_timeout_s,
            tensor_parallel_size=tensor_parallel_size,
            data_parallel_size=data_parallel_size,
            # One trainer process assumed here, so that a bad value fails now; `setup` chooses
            # again once the trainer's world size is known.
            weight_transfer=select_weight_transfer(weight_transfer, _trainer_device_type(), placement, trainer_processes=1),
        )
        self.weight_transfer, self.placement = weight_transfer, placement
        if placement == "local":  # vLLM's parallelism inside an engine, checked where it will run (a Ray actor checks its own)
            parallelism_args(engine_config, _trainer_device_type())
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
            env_failure_limit=env_failure_limit,
            env_failure_window=env_failure_window,
            engine_restarts=engine_restarts,
            num_engines=num_engines,
            **_placement(placement, ray_address, ray_cpus_per_engine, ray_gpus_per_engine),
        )

    def setup(self, stage: str) -> None:
        # Under DDP every rank reaches the one service through rank 0 (before the callbacks'
        # setup, which looks the service up here).
        trainer = self.trainer
        if trainer is not None:
            route = select_weight_transfer(self.weight_transfer, _trainer_device_type(), self.placement, trainer.world_size)
            self.rollouts = self.rollouts.configure(trainer.world_size, trainer.global_rank, route)

    def state_dict(self) -> dict:
        # Saved in every checkpoint: produced = trained + dropped + pending holds across a resume.
        return {"rollout_service": self.rollouts.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        if "rollout_service" in state_dict:
            self.rollouts.load_state_dict(state_dict["rollout_service"])
        elif "rollout_accounting" in state_dict:  # checkpoints written before 2026-12-03
            self.rollouts.load_state_dict({"accounting": state_dict["rollout_accounting"]})

    def train_dataloader(self) -> DataLoader:
        # batch_size=None: the dataset yields whole collated batches; workers must stay in-process.
        return DataLoader(_ServiceStream(self.rollouts, self.batch_timeout_s), batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        # Held-out instances in chunks (a progress-bar tick each), played at validation time.
        evaluation = _HeldOutEvaluation(self.rollouts, self.eval_instances, self.eval_samples, self.eval_k, self.eval_timeout_s)
        return DataLoader(evaluation, batch_size=None, num_workers=0)

    def teardown(self, stage: str) -> None:
        self.rollouts.close()

    def on_exception(self, exception: BaseException) -> None:
        # Lightning skips `teardown` when fit raises (or is interrupted): close here too.
        self.rollouts.close()
        if isinstance(exception, Terminated):
            end_other_ranks(self.trainer)


class _ServiceStream(IterableDataset):
    def __init__(self, rollouts: RolloutService, timeout_s: float) -> None:
        self.rollouts, self.timeout_s = rollouts, timeout_s

    def __iter__(self) -> Iterator[dict]:
        while True:
            yield self.rollouts.next_batch(self.timeout_s)


class _HeldOutEvaluation(IterableDataset):
    """Yields, per chunk of held-out instances, what the service's `evaluate` played, plus `k`."""

    chunk_size = 8

    def __init__(self, rollouts: RolloutService, instances: list, samples: int, k: int, timeout_s: float) -> None:
        self.rollouts, self.instances, self.samples, self.k, self.timeout_s = rollouts, instances, samples, k, timeout_s

    def __len__(self) -> int:
        return -(-len(self.instances) // self.chunk_size)

    def __iter__(self) -> Iterator[dict]:
        for start in range(0, len(self.instances), self.chunk_size):
            chunk = self.instances[start : start + self.chunk_size]
            yield {**self.rollouts.evaluate(chunk, self.samples, self.timeout_s), "k": self.k}


def _trainer_device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _placement(placement: str, ray_address: str | None, num_cpus: float, num_gpus: float) -> dict:
    """What starts each engine and the dedicated old-logit worker: here (`VLLMEngine`,
    `ProcessWorker`) or as Ray actors (`RayEngine`, `RayWorker`) with the given resources."""
    if placement == "local":
        return {"engine_factory": VLLMEngine, "old_logit_worker_factory": ProcessWorker}
    if placement != "ray":
        raise ValueError(f"{config_key('data.placement')} must be 'local' or 'ray', got {placement!r}")
    if not num_cpus > 0 or num_gpus < 0:
        raise ValueError(
            f"{config_key('data.ray_cpus_per_engine')} must be > 0 and {config_key('data.ray_gpus_per_engine')} >= 0, got {num_cpus} and {num_gpus}"
        )
    if importlib.util.find_spec("ray") is None:
        placement_key = config_key("data.placement")
        raise ValueError(f'{placement_key}=ray needs Ray: pip install "lit-asyncrl[ray]" (or set {placement_key}=local)')
    from lit_asyncrl.rollout.ray_engine import RayEngine
    from lit_asyncrl.rollout.ray_placement import RayPlacement
    from lit_asyncrl.rollout.ray_worker import RayWorker

    resources = RayPlacement(address=ray_address, num_cpus=num_cpus, num_gpus=num_gpus)
    return {
        "engine_factory": functools.partial(RayEngine, placement=resources),
        "old_logit_worker_factory": functools.partial(RayWorker, placement=resources),
    }


def _require_int(key: str, value: object, minimum: int) -> None:
    """`value` must be a whole number >= minimum (a YAML 1.5 or true is a typo, not a count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{config_key('data.' + key)} must be an integer >= {minimum}, got {value!r}")


def _validate_eval(eval_instances: int, eval_samples: int, eval_k: int) -> None:
    _require_int("eval_instances", eval_instances, 1)
    _require_int("eval_k", eval_k, 1)
    _require_int("eval_samples", eval_samples, 1)
    if eval_samples < eval_k:
        raise ValueError(
            f"{config_key('data.eval_samples')}={eval_samples} must be >= {config_key('data.eval_k')}={eval_k} (pass@k needs n >= k samples)"
        )


def _validate_engine(dtype: str, max_model_len: int, kv_cache_fraction: float, max_concurrent_groups: int, top_k: int) -> None:
    dtypes = ("float32", "bfloat16", "float16")
    if dtype not in dtypes:
        raise ValueError(f"{config_key('data.dtype')} must be one of {dtypes}, got {dtype!r}")
    _require_int("max_model_len", max_model_len, 2)
    if not 0.0 < kv_cache_fraction <= 1.0:
        raise ValueError(f"{config_key('data.kv_cache_fraction')} must be in (0, 1], got {kv_cache_fraction}")
    _require_int("max_concurrent_groups", max_concurrent_groups, 1)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not (top_k == -1 or top_k >= 1):
        raise ValueError(f"{config_key('data.top_k')} must be -1 (no top-k) or an integer >= 1, got {top_k!r}")


def _validate(
    group_size, groups_per_batch, max_version_gap, buffer_capacity, mode, weight_sync_every, temperature, engine_log_level
) -> None:
    _require_int("group_size", group_size, 1)
    _require_int("groups_per_batch", groups_per_batch, 1)
    _require_int("max_version_gap", max_version_gap, 0)
    _require_int("buffer_capacity", buffer_capacity, 1)
    if group_size * groups_per_batch > buffer_capacity:
        raise ValueError(
            f"{config_key('data.buffer_capacity')}={buffer_capacity} is smaller than one batch "
            f"({config_key('data.groups_per_batch')} * {config_key('data.group_size')} = {groups_per_batch * group_size} episodes)"
        )
    if mode not in ("async", "sync"):
        raise ValueError(f"{config_key('data.mode')} must be 'async' or 'sync', got {mode!r}")
    _require_int("weight_sync_every", weight_sync_every, 1)
    if mode == "sync" and weight_sync_every != 1:
        raise ValueError(
            f"{config_key('data.mode')}='sync' needs {config_key('data.weight_sync_every')}=1 (each batch from the latest weights)"
        )
    if not temperature > 0:
        raise ValueError(f"{config_key('data.temperature')} must be > 0, got {temperature}")
    levels = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
    if str(engine_log_level).upper() not in levels:
        raise ValueError(f"{config_key('data.engine_log_level')} must be one of {levels}, got {engine_log_level!r}")
