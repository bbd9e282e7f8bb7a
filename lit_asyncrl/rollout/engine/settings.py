"""The engine's settings and their translation into vLLM's engine arguments and its engine-core process's
environment."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any

import torch

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.models.lora import LoRASettings
from lit_asyncrl.rollout.processes.core_exit import FAST_EXIT_VARIABLE
from lit_asyncrl.rollout.processes.core_fork import forked_engine_core_environment
from lit_asyncrl.rollout.processes.core_semaphores import UNNAMED_LOCKS_VARIABLE
from lit_asyncrl.rollout.processes.spawn_environment import START_METHOD_VARIABLE
from lit_asyncrl.rollout.processes.temp_dirs import engine_environment

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
DTYPES = ("float32", "bfloat16", "float16")
#: The methods this library adds to vLLM's worker (the staged push's, the routing capture's).
ENGINE_WORKER_EXTENSION = "lit_asyncrl.rollout.engine.worker_extension.EngineWorkerExtension"
#: Requests one engine runs at once (vLLM's `max_num_seqs`): more than a run keeps in flight.
MAX_NUM_SEQS = 256


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """Each vLLM engine (`rollout.<key>`): precision, context, memory, logging, liveness, parallelism,
    weight route. Checked when made, naming the key."""

    #: "bfloat16" gives a real training-inference discrepancy against the fp32 trainer.
    dtype: str = "float32"
    #: Prompt plus every turn of an episode must fit.
    max_model_len: int = 512
    #: Share of memory each engine reserves for its KV cache (vLLM's gpu_memory_utilization; on CPU, of the RAM).
    kv_cache_fraction: float = 0.2
    #: Or a fixed size in GiB (vLLM's kv_cache_memory_bytes), used instead of the fraction when set. On
    #: CPU vLLM sizes the cache as the fraction of the NUMA node's memory minus the engine process's
    #: own, which on a small or ballooning machine can come out negative; a size does not depend on it.
    kv_cache_gib: float | None = None
    #: vLLM's own log level. Every weight push makes vLLM log a reload warning and a loading bar;
    #: ERROR keeps Lightning's progress bar readable ("INFO" shows everything again).
    engine_log_level: str = "ERROR"
    #: An engine with requests in flight that streams nothing for this long (outside a pause) has
    #: stopped answering and is reported dead, though its processes still run.
    engine_stall_timeout_s: float = 120.0
    #: vLLM's parallelism inside each engine (GPUs only): tensor shards and data-parallel replicas.
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    #: How each version's weights reach the engines: "auto", "file", "staged", "gloo", "nccl" or "ipc"
    #: (`rollout/weights/choice.py`, which resolves "auto" for the machine before any engine starts).
    weight_transfer: str = "auto"
    #: With `weight_transfer="staged"`: of a full fine-tune's new tensors, only the elements whose
    #: bits changed in the engine's dtype travel (`rollout/weights/changed_elements.py`).
    push_changed_elements: bool = False
    #: On CPU, run the model worker inside vLLM's engine-core process (with one OpenMP thread)
    #: instead of the second spawned process vLLM's CPU platform picks: starts about 5 s sooner and
    #: generates faster beside a training process (`benchmarks/bench_engine.py`).
    worker_in_engine_process: bool = True
    #: The policy's LoRA adapter, as `model.lora` sets it (the Hydra config ties the two): with
    #: `push="adapter"` each version is an adapter the engine holds beside the base weights.
    lora: LoRASettings = LoRASettings()
    #: For a mixture of experts: each turn also carries the experts every layer chose for each position
    #: the engine computed (`TurnOutput.routed_experts`; `routing_capture.py`).
    capture_routing: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"{config_key('rollout.dtype')} must be one of {DTYPES}, got {self.dtype!r}")
        require_int("max_model_len", self.max_model_len, 2)
        if not 0.0 < self.kv_cache_fraction <= 1.0:
            raise ValueError(
                f"{config_key('rollout.kv_cache_fraction')} must be in (0, 1], got {self.kv_cache_fraction}"
            )
        if self.kv_cache_gib is not None and not self.kv_cache_gib > 0:
            raise ValueError(f"{config_key('rollout.kv_cache_gib')} must be > 0 or null, got {self.kv_cache_gib}")
        if str(self.engine_log_level).upper() not in LOG_LEVELS:
            raise ValueError(
                f"{config_key('rollout.engine_log_level')} must be one of {LOG_LEVELS}, got {self.engine_log_level!r}"
            )
        require_positive("engine_stall_timeout_s", self.engine_stall_timeout_s)
        require_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        require_int("data_parallel_size", self.data_parallel_size, 1)

    @property
    def serves_adapters(self) -> bool:
        return self.lora.serves_adapters

    def torch_dtype(self) -> torch.dtype:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[self.dtype]

    def kv_cache_bytes(self) -> int | None:
        """vLLM's `kv_cache_memory_bytes` (None: sized by `kv_cache_fraction`)."""
        return None if self.kv_cache_gib is None else int(self.kv_cache_gib * 2**30)

    def engine_workers(self) -> int:
        """vLLM's workers in one engine (each joins a weight transfer's group)."""
        return self.tensor_parallel_size * self.data_parallel_size


def require_int(key: str, value: object, minimum: int) -> None:
    """`rollout.<key>` must be a whole number >= minimum (a YAML 1.5 or true is a typo, not a count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{config_key('rollout.' + key)} must be an integer >= {minimum}, got {value!r}")


def require_positive(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{config_key('rollout.' + key)} must be > 0, got {value!r}")


def parallelism_args(config: EngineSettings, device_type: str) -> dict[str, int]:
    """vLLM engine arguments for `config`'s tensor and data parallelism on `device_type`.

    Passed through as they are on GPUs; refused on CPU, where an engine is one worker (the project
    runs it inside the engine-core process, `worker_in_engine_process`).
    """
    sizes = {"tensor_parallel_size": config.tensor_parallel_size, "data_parallel_size": config.data_parallel_size}
    for key, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{config_key('rollout.' + key)} must be an integer >= 1, got {size!r}")
    if device_type == "cpu" and (config.tensor_parallel_size, config.data_parallel_size) != (1, 1):
        raise ValueError(
            f"{config_key('rollout.tensor_parallel_size')}={config.tensor_parallel_size} and "
            f"{config_key('rollout.data_parallel_size')}={config.data_parallel_size}: "
            f"vLLM's parallelism inside an engine needs GPUs; on CPU use {config_key('rollout.num_engines')} "
            "for more engines"
        )
    return sizes


def engine_args(
    model_path: str, config: EngineSettings, device_type: str, seed: int, route_arguments: dict[str, Any]
) -> Any:
    """vLLM's `AsyncEngineArgs` for an engine with `config` on `device_type` sampling from `seed`,
    taking its weights by a route that needs `route_arguments` (`WeightRoute.engine_arguments`)."""
    from vllm import AsyncEngineArgs

    # The routing capture and the staged route live in one worker extension: a run with both names it once.
    capture = {"worker_extension_cls": ENGINE_WORKER_EXTENSION} if config.capture_routing else {}
    return AsyncEngineArgs(
        model=model_path,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        gpu_memory_utilization=config.kv_cache_fraction,
        kv_cache_memory_bytes=config.kv_cache_bytes(),
        max_num_seqs=MAX_NUM_SEQS,
        seed=seed,
        # No CUDA graphs or compiled kernels: the engine starts at once, and on CPU nothing needs them.
        enforce_eager=True,
        use_tqdm_on_load=False,
        # mu must be the log-prob of the distribution actually sampled (temperature applied).
        logprobs_mode="processed_logprobs",
        # No request statistics: nothing here reads them, and each AsyncLLM that keeps them
        # registers vLLM's Prometheus metrics in the process-wide registry, which two engines
        # starting at once in one trainer race for (seen: DuplicateTimeseries, an engine that
        # failed to start in a two-engine run).
        disable_log_stats=True,
        **parallelism_args(config, device_type),
        **(capture | route_arguments),
    )


def sampling_params(
    max_tokens: int, temperature: float, top_k: int, stop_token_ids: Sequence[int], ignore_eos: bool
) -> Any:
    """vLLM's sampling parameters of one request: streamed in deltas, token ids only, with mu."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        logprobs=0,
        stop_token_ids=list(stop_token_ids),
        ignore_eos=ignore_eos,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )


def set_engine_log_level(log_level: str) -> None:
    """vLLM's log level, read by vLLM at import and by its engine process at spawn (so set before either)."""
    os.environ["VLLM_LOGGING_LEVEL"] = log_level.upper()
    if log_level.upper() in ("ERROR", "CRITICAL"):
        # The engine's own process reads these at its start: without them it prints torch's
        # deprecation FutureWarnings and a NUMA-binding notice under the progress bar.
        os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    logging.getLogger("vllm").setLevel(log_level.upper())


def vllm_device_type() -> str:
    """vLLM's platform on this machine ("cpu", "cuda", ...)."""
    from vllm.platforms import current_platform

    return current_platform.device_type


def vllm_config(
    model_path: str, config: EngineSettings, device_type: str, seed: int, route_arguments: dict[str, Any]
) -> Any:
    """vLLM's engine config for `config` on `device_type`, with one CPU worker in the engine core."""
    chosen_start_method = os.environ.get(START_METHOD_VARIABLE)
    try:
        made = engine_args(model_path, config, device_type, seed, route_arguments).create_engine_config()
    finally:
        # vLLM's CPU platform sets the start method to spawn for the whole process as it makes a
        # config; keep the caller's own choice (`engine_core_environment` reads it).
        if chosen_start_method is None:
            os.environ.pop(START_METHOD_VARIABLE, None)
        else:
            os.environ[START_METHOD_VARIABLE] = chosen_start_method
    if config.worker_in_engine_process and device_type == "cpu":
        # One worker needs no process of its own: vLLM's CPU platform still picks the
        # multiprocess executor, which spawns a second Python process beside the engine core
        # (its imports cost about 5 s at every start, its exit 2 s at every shutdown). The
        # engine core runs it in-process instead.
        made.parallel_config.distributed_executor_backend = "uni"
    return made


def engine_core_environment(settings: EngineSettings, config: Any) -> dict[str, str]:
    """The environment the engine-core process of vLLM config `config` starts with."""
    in_process = (
        config.parallel_config.distributed_executor_backend == "uni" and config.device_config.device_type == "cpu"
    )
    # vLLM's sockets and the engine core's temp files go to this process's run dir (`temp_dirs.py`).
    environment = engine_environment()
    # No /dev/shm/sem.mp-* file outlives an engine core killed with its resource tracker.
    environment[UNNAMED_LOCKS_VARIABLE] = "1"
    if in_process:
        # In-process, the CPU worker skips vLLM's usual thread binding and its
        # `torch.set_num_threads` calls, so the engine core would run one OpenMP thread per core
        # beside the trainer's own, and the two pools' spin-waits slow generation about 5x on a
        # busy 2-core machine (measured: 1,950 against 10,700 tokens/s). One thread is what the
        # multiprocess executor's binding gave it.
        environment["OMP_NUM_THREADS"] = "1"
    if in_process and os.environ.get(START_METHOD_VARIABLE) != "spawn":
        # Forked, the engine core skips the imports a spawned one repeats (`engine_core_fork.py`).
        environment.update(
            forked_engine_core_environment(quiet=settings.engine_log_level.upper() in ("ERROR", "CRITICAL"))
        )
    elif config.device_config.device_type == "cpu":
        environment[START_METHOD_VARIABLE] = "spawn"  # what vLLM's CPU platform asks for its processes
    if config.device_config.device_type == "cpu":
        # vLLM's sampler still compiles two small functions with torch.compile (the sampled
        # token's rank for its log-prob, and the random sampling) at the first request: 7-16 s
        # of the engine core's time before the first token on this 2-core machine, and inductor's
        # cache files in the temp dir. Eager, the same operations take 0.06 s for that request.
        # Nothing else in an eager CPU engine uses torch.compile.
        environment["TORCHDYNAMO_DISABLE"] = "1"
    if config.device_config.device_type == "cpu":
        # The engine core's interpreter finalization after vLLM's own clean-up took 1.3 s of
        # every 2.3 s shutdown (`engine_core_exit.py`); measured on CPU only, so armed there.
        environment[FAST_EXIT_VARIABLE] = "1"
    return environment
