"""The vLLM engine in the background: an `AsyncLLM` on its own event-loop thread.

The trainer thread talks to it through thread-safe calls (`run`, `push_weights`); episodes run as
asyncio tasks inside the engine loop, so many multi-turn episodes stream concurrently.

Weights reach the engine in place: the engine pauses with in-flight requests kept and their KV
cache cleared, loads the new weights layer-wise (from a safetensors file in /dev/shm, or over
vLLM's weight-transfer API: `weight_transfer.py`), takes the new version label and resumes. Clearing the cache is
what makes every token after the resume come from the new weights only, so the version label on a
token is the version that sampled it (a kept stale KV would mix two versions).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import gc
import logging
import multiprocessing
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors.torch import save_file

from lit_asyncrl.rollout.engine_core_exit import FAST_EXIT_VARIABLE
from lit_asyncrl.rollout.reaper import start_reaper, stop_reaper
from lit_asyncrl.rollout.temp_dirs import engine_environment, make_weights_dir, run_dir
from lit_asyncrl.rollout.weight_transfer import EngineWeightSyncClient, WeightSender, weights_for_engine

T = TypeVar("T")


_environment_lock = threading.Lock()
_environment_holders = 0
_environment_saved: dict[str, str | None] = {}


@contextlib.contextmanager
def _spawned_process_environment(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in the environment while the block spawns processes (which read it at their start
    only); the caller's own values come back after the block, however it ends.

    Engines start on threads of their own at the same time, each with the same values: the first
    block in saves the caller's values and the last one out restores them, so no start sees them
    swapped back half-way and none is left behind.
    """
    global _environment_holders
    with _environment_lock:
        if _environment_holders == 0:
            _environment_saved.clear()
            _environment_saved.update({key: os.environ.get(key) for key in values})
        _environment_holders += 1
        os.environ.update(values)
    try:
        yield
    finally:
        with _environment_lock:
            _environment_holders -= 1
            if _environment_holders == 0:
                for key, value in _environment_saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value


class EngineDeadError(RuntimeError):
    """The vLLM engine (its loop thread or its engine-core process) is gone."""


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Settings of the vLLM engine (one key per engine argument that matters here)."""

    dtype: str = "float32"  # "bfloat16" gives a real train-inference discrepancy
    max_model_len: int = 256
    kv_cache_fraction: float = 0.2  # vLLM's gpu_memory_utilization: on CPU, the RAM share for KV
    #: A fixed KV cache size instead (vLLM's kv_cache_memory_bytes). On CPU vLLM sizes the cache as
    #: the fraction of the NUMA node's memory minus the engine process's own, which on a small or
    #: ballooning machine can come out negative; a size in bytes does not depend on the machine.
    kv_cache_bytes: int | None = None
    max_num_seqs: int = 256
    seed: int = 0
    enforce_eager: bool = True
    #: On CPU, run the model worker inside vLLM's engine-core process (with one OpenMP thread)
    #: instead of the second spawned process vLLM's CPU platform picks: starts about 5 s sooner and
    #: generates faster beside a training process (`benchmarks/bench_engine.py`).
    worker_in_engine_process: bool = True
    #: vLLM's own log level. Every weight push makes vLLM log a reload warning and a loading bar;
    #: ERROR keeps Lightning's progress bar readable ("INFO" shows everything again).
    log_level: str = "ERROR"
    #: An engine with requests in flight that streams nothing for this long (outside a pause) has
    #: stopped answering and is reported dead, though its processes still run.
    stall_timeout_s: float = 120.0
    #: vLLM's own parallelism inside one engine (GPUs): shards of each layer, and replicas.
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    #: How weights reach the engine (`weight_transfer.py`): "file", or a backend of vLLM's
    #: weight-transfer API, "gloo", "nccl" or "ipc" (chosen by `select_weight_transfer`).
    weight_transfer: str = "file"

    def torch_dtype(self) -> torch.dtype:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[self.dtype]

    def engine_workers(self) -> int:
        """vLLM's workers in one engine (each joins a weight transfer's group)."""
        return self.tensor_parallel_size * self.data_parallel_size


def parallelism_args(config: EngineConfig, device_type: str) -> dict[str, int]:
    """vLLM engine arguments for `config`'s tensor and data parallelism on `device_type`.

    Passed through as they are on GPUs; refused on CPU, where an engine is one worker (the project
    runs it inside the engine-core process, `worker_in_engine_process`).
    """
    sizes = {"tensor_parallel_size": config.tensor_parallel_size, "data_parallel_size": config.data_parallel_size}
    for key, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"rollout.{key} must be an integer >= 1, got {size!r}")
    if device_type == "cpu" and (config.tensor_parallel_size, config.data_parallel_size) != (1, 1):
        raise ValueError(
            f"rollout.tensor_parallel_size={config.tensor_parallel_size} and rollout.data_parallel_size={config.data_parallel_size}: "
            "vLLM's parallelism inside an engine needs GPUs; on CPU use rollout.num_engines for more engines"
        )
    return sizes


def engine_args(model_path: str, config: EngineConfig, device_type: str) -> Any:
    """vLLM's `AsyncEngineArgs` for an engine with `config` on `device_type`."""
    from vllm import AsyncEngineArgs
    from vllm.config import WeightTransferConfig

    return AsyncEngineArgs(
        model=model_path,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        gpu_memory_utilization=config.kv_cache_fraction,
        kv_cache_memory_bytes=config.kv_cache_bytes,
        max_num_seqs=config.max_num_seqs,
        seed=config.seed,
        enforce_eager=config.enforce_eager,
        use_tqdm_on_load=False,
        # mu must be the log-prob of the distribution actually sampled (temperature applied).
        logprobs_mode="processed_logprobs",
        # The `file` route reloads from disk; every other route is a backend of vLLM's weight-transfer API.
        weight_transfer_config=None if config.weight_transfer == "file" else WeightTransferConfig(backend=config.weight_transfer),
        **parallelism_args(config, device_type),
    )


@dataclasses.dataclass
class TurnOutput:
    """One generated turn: token ids, their behaviour log-probs mu and the version that sampled each."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str | None


class VLLMEngine:
    """A vLLM `AsyncLLM` running on a background thread with its own asyncio loop."""

    def __init__(self, model_path: str | Path, config: EngineConfig = EngineConfig()) -> None:
        self.model_path = str(model_path)
        self.config = config
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._llm: Any = None
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        self._weights_dir = make_weights_dir()
        self._reaper: subprocess.Popen | None = None
        self.version = 0
        # Stall watch: requests in flight, when the engine last showed progress, whether it is paused.
        self._requests_in_flight = 0
        self._last_progress = time.monotonic()
        self._paused = False
        self._sender = (
            None
            if config.weight_transfer == "file"
            else WeightSender(config.weight_transfer, config.torch_dtype(), config.engine_workers())
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, initial_version: int = 0, timeout_s: float = 300.0) -> None:
        """Start the engine thread and wait until the engine serves requests."""
        self.launch(initial_version)
        self.wait_until_serving(timeout_s)

    def launch(self, initial_version: int = 0) -> None:
        """Start making the engine in the background and return at once (`wait_until_serving` waits).

        The engine's own process spends most of its start importing; launched early, that overlaps
        with work the trainer does meanwhile (the warm start).
        """
        self.version = initial_version
        # Read by vLLM at import and by its engine process at spawn, so set before either.
        os.environ["VLLM_LOGGING_LEVEL"] = self.config.log_level.upper()
        if self.config.log_level.upper() in ("ERROR", "CRITICAL"):
            # The engine's own process reads these at its start: without them it prints torch's
            # deprecation FutureWarnings and a NUMA-binding notice under the progress bar.
            os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
            os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        logging.getLogger("vllm").setLevel(self.config.log_level.upper())
        _standard_start_method()
        # Before the engine's processes exist: if this process is SIGKILLed, the reaper kills them
        # and removes the files vLLM made for them (sockets, rendezvous files: `temp_dirs.py`).
        self._reaper = start_reaper([self._weights_dir, run_dir()])
        self._thread = threading.Thread(target=self._thread_main, name="vllm-engine", daemon=True)
        self._thread.start()

    def wait_until_serving(self, timeout_s: float = 300.0) -> None:
        """Block until the launched engine serves requests; raise if its start failed."""
        if not self._started.wait(timeout_s):
            raise TimeoutError(f"vLLM engine did not start within {timeout_s} s")
        if self._startup_error is not None:
            raise RuntimeError("vLLM engine failed to start") from self._startup_error

    def _thread_main(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._create_llm())
        except BaseException as error:  # reported to the starting thread
            self._startup_error = error
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()

    async def _create_llm(self) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        args = engine_args(self.model_path, self.config, _device_type())
        config = args.create_engine_config()
        in_process = self.config.worker_in_engine_process and config.device_config.device_type == "cpu"
        if in_process:
            # One worker needs no process of its own: vLLM's CPU platform still picks the
            # multiprocess executor, which spawns a second Python process beside the engine core
            # (its imports cost about 5 s at every start, its exit 2 s at every shutdown). The
            # engine core runs it in-process instead.
            config.parallel_config.distributed_executor_backend = "uni"
        # vLLM's sockets and the engine core's temp files go to this process's run dir (`temp_dirs.py`).
        environment = engine_environment()
        if in_process:
            # In-process, the CPU worker skips vLLM's usual thread binding and its
            # `torch.set_num_threads` calls, so the engine core would run one OpenMP thread per core
            # beside the trainer's own, and the two pools' spin-waits slow generation about 5x on a
            # busy 2-core machine (measured: 1,950 against 10,700 tokens/s). One thread is what the
            # multiprocess executor's binding gave it.
            environment["OMP_NUM_THREADS"] = "1"
        if config.device_config.device_type == "cpu" and self.config.enforce_eager:
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
        # No local name for the engine: vLLM's lazy imports can keep this frame alive until exit,
        # and an AsyncLLM still referenced then runs its __del__ against torn-down modules.
        with _spawned_process_environment(environment):
            self._llm = AsyncLLM.from_vllm_config(config)
        await self._llm.update_weight_version(str(self.version))

    def shutdown(self, startup_timeout_s: float = 300.0) -> None:
        """Stop the engine, its process and its thread, and remove its temp dir; safe to call twice.

        Called while the engine is still starting (e.g. a signal during `start`), it first lets
        the start finish: vLLM's engine creation cannot be interrupted half-way, and shutting down
        a half-made engine from its own loop would cancel the start and strand the shutdown.
        """
        try:
            if self._sender is not None:
                self._sender.close()
            if self._thread is not None and not self._started.wait(startup_timeout_s):
                raise TimeoutError(f"the vLLM engine neither started nor failed within {startup_timeout_s} s")
            if self._loop is not None and not self._loop.is_running() and self._llm is not None:
                # The start failed after the engine was made: shut it down here, no loop to use.
                llm, self._llm = self._llm, None
                llm.shutdown()
            if self._loop is not None and self._loop.is_running():
                # Shut the engine down from its own loop, output handler first, so nothing in the
                # loop is left reading from a dead engine core.
                asyncio.run_coroutine_threadsafe(self._shutdown_in_loop(), self._loop).result(timeout=60)
                self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=30)
                self._thread = None
        finally:
            if self._loop is not None and not self._loop.is_running() and not self._loop.is_closed():
                self._loop.close()
            # Collect the AsyncLLM now: left to interpreter exit, its __del__ runs against torn-down modules.
            gc.collect()
            shutil.rmtree(self._weights_dir, ignore_errors=True)
            stop_reaper(self._reaper)
            self._reaper = None

    def dead_reason(self) -> str | None:
        """Why the engine cannot serve any more (None while it is healthy)."""
        if self._thread is None or self._llm is None:
            return None
        if not self._thread.is_alive():
            return "its event-loop thread exited"
        if self._llm.errored:
            return "its engine-core process died or its output handler stopped"
        stalled_s = self.stalled_for()
        if stalled_s > self.config.stall_timeout_s:
            return (
                f"it stopped answering: no output for {stalled_s:.0f} s with {self._requests_in_flight} requests in flight "
                f"(stall timeout {self.config.stall_timeout_s:g} s, data.engine_stall_timeout_s)"
            )
        return None

    def stalled_for(self) -> float:
        """Seconds without output while requests wait for it (0 when idle or paused on purpose)."""
        if self._requests_in_flight == 0 or self._paused:
            return 0.0
        return time.monotonic() - self._last_progress

    def _progress(self) -> None:
        self._last_progress = time.monotonic()

    async def _shutdown_in_loop(self) -> None:
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        handler = getattr(llm, "output_handler", None)
        if handler is not None:
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
        llm.shutdown()
        # Tasks still on this loop (cancelled episodes) end here, not in a __del__ at exit.
        pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the engine is not started; call start() first")
        return self._loop

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None, stalled: str | None = None) -> T:
        """Run a coroutine on the engine loop from another thread and wait for its result.

        Raises `EngineDeadError` within about a second if the engine dies while waiting, and in
        place of whatever a dead engine's call raised (vLLM's own errors name no part). With
        `stalled` (what the call is, e.g. "a weight push"), running past `timeout_s` means the
        engine stopped answering (`EngineDeadError`); without it, a plain `TimeoutError`.
        """
        return run_watched(self.loop, coroutine, self.dead_reason, timeout_s, stalled)

    # -- generation (called inside the engine loop) ------------------------------------------
    async def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        temperature: float,
        top_k: int = -1,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        on_tokens: Callable[[list[int], list[float]], None] | None = None,
    ) -> TurnOutput:
        """Sample one turn, streaming; returns the tokens with mu and per-token versions.

        `on_tokens(ids, logprobs)` sees each streamed piece as it arrives, so a partial turn is
        visible (e.g. to score it before its version is replaced); the final versions come from
        vLLM's spans in the returned `TurnOutput`.
        """
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            logprobs=0,
            stop_token_ids=list(stop_token_ids),
            ignore_eos=ignore_eos,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )
        token_ids: list[int] = []
        logprobs: list[float] = []
        final = None
        stream = self._llm.generate(TokensPrompt(prompt_token_ids=list(prompt_ids)), params, request_id=uuid.uuid4().hex)
        if self._requests_in_flight == 0:
            self._progress()  # an idle engine starts its stall clock with the first request
        self._requests_in_flight += 1
        try:
            async for message in stream:
                self._progress()
                completion = message.outputs[0]
                new_logprobs = [entry[token].logprob for token, entry in zip(completion.token_ids, completion.logprobs or ())]
                token_ids.extend(completion.token_ids)
                logprobs.extend(new_logprobs)
                if on_tokens is not None and completion.token_ids:
                    on_tokens(list(completion.token_ids), new_logprobs)
                final = completion
        finally:
            self._requests_in_flight -= 1
        versions = _expand_version_spans(final.weight_versions, len(token_ids), self.version)
        return TurnOutput(token_ids, logprobs, versions, final.finish_reason if final else None)

    # -- weights (called from the trainer thread) --------------------------------------------
    def push_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> dict[str, float]:
        """Load `state_dict` into the engine in place and label what follows `version`.

        Returns timings in seconds: `write_s` (trainer side, engine still running) and `pause_s`
        (the time the engine stands still: pause -> load -> relabel -> resume).
        """
        if self._sender is not None:
            return self._send_weights(state_dict, version)
        start = time.perf_counter()
        path = self._write_weights(state_dict)
        written = time.perf_counter()
        # Bounded: a hung engine must not hold the trainer forever (the stall timeout names it).
        self.run(self._swap_weights(path, version), timeout_s=self.config.stall_timeout_s, stalled="a weight push")
        return {"write_s": written - start, "pause_s": time.perf_counter() - written}

    def _send_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> dict[str, float]:
        """The push over vLLM's weight-transfer API: the engine stands still while the tensors travel."""
        start = time.perf_counter()
        self.pause()
        try:
            self._sender.push(state_dict, self.weight_sync_client())
            self.set_version(version)
        finally:
            if self.dead_reason() is None:
                self.resume()
        return {"write_s": 0.0, "pause_s": time.perf_counter() - start}

    def weight_sync_client(self) -> EngineWeightSyncClient:
        """vLLM's weight-sync control plane of this engine, callable from the trainer thread."""
        return EngineWeightSyncClient(
            lambda coroutine: self.run(coroutine, timeout_s=self.config.stall_timeout_s, stalled="a weight push"), self._llm
        )

    def set_version(self, version: int) -> None:
        """Label what the engine samples from now on `version` (after weights arrived another way)."""
        self.run(self._llm.update_weight_version(str(version)), timeout_s=self.config.stall_timeout_s, stalled="a weight push")
        self.version = version

    def _write_weights(self, state_dict: Mapping[str, torch.Tensor]) -> Path:
        tensors = {
            name: tensor.to("cpu").contiguous().clone() for name, tensor in weights_for_engine(state_dict, self._torch_dtype()).items()
        }
        path = self._weights_dir / "model.safetensors"
        save_file(tensors, str(path))
        return path

    def pause(self) -> None:
        """Freeze generation (in-flight requests kept, KV cleared) until `resume` or a weight push."""
        self._paused = True
        self.run(self._llm.pause_generation(mode="keep", clear_cache=True), timeout_s=self.config.stall_timeout_s, stalled="a pause")

    def resume(self) -> None:
        self.run(self._llm.resume_generation(), timeout_s=self.config.stall_timeout_s, stalled="a resume")
        self._paused = False
        self._progress()

    async def _swap_weights(self, path: Path, version: int) -> None:
        self._paused = True
        await self._llm.pause_generation(mode="keep", clear_cache=True)
        try:
            await self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path.parent)})
            await self._llm.update_weight_version(str(version))
            self.version = version
        finally:
            await self._llm.resume_generation()
            self._paused = False
            self._progress()

    def _torch_dtype(self) -> torch.dtype:
        return self.config.torch_dtype()


def run_watched(
    loop: asyncio.AbstractEventLoop,
    coroutine: Coroutine[Any, Any, T],
    dead_reason: Callable[[], str | None],
    timeout_s: float | None = None,
    stalled: str | None = None,
) -> T:
    """`coroutine` on `loop` (another thread's), waited for while `dead_reason()` stays None
    (see `VLLMEngine.run`)."""
    future = asyncio.run_coroutine_threadsafe(coroutine, loop)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        wait_s = 1.0 if deadline is None else min(1.0, max(deadline - time.monotonic(), 0.0))
        try:
            return future.result(wait_s)
        except concurrent.futures.TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                future.cancel()
                if stalled:
                    raise EngineDeadError(
                        f"the vLLM engine stopped answering: {stalled} got no answer within {timeout_s:g} s (data.engine_stall_timeout_s)"
                    ) from None
                raise TimeoutError(f"the vLLM engine did not answer within {timeout_s} s") from None
            error = None
        except Exception as raised:
            error = raised
        reason = dead_reason()
        if reason is not None:
            future.cancel()
            raise EngineDeadError(f"the vLLM engine died: {reason}") from error
        if error is not None:
            raise error


def _expand_version_spans(spans: Any, num_tokens: int, fallback: int) -> list[int]:
    """Per-token versions from vLLM's `(version, start, end)` spans over the generated tokens."""
    if not spans:
        return [fallback] * num_tokens
    versions = [fallback] * num_tokens
    for span in spans:
        version, start, end = (span.version, span.start, span.end) if hasattr(span, "version") else span
        versions[start:end] = [int(version)] * (end - start)
    return versions


def _standard_start_method() -> None:
    """A process vLLM spawns is told this process's multiprocessing start method by name and sets
    it first thing. Inside a joblib worker (Hydra's parallel launcher) that name is 'loky', which a
    plain Python child cannot resolve: the engine core would die at birth. Use 'spawn' there."""
    if multiprocessing.get_start_method(allow_none=True) not in (None, "spawn", "fork", "forkserver"):
        multiprocessing.set_start_method("spawn", force=True)


def _device_type() -> str:
    from vllm.platforms import current_platform

    return current_platform.device_type
