"""The vLLM engine in the background: an `AsyncLLM` on its own event-loop thread.

The trainer thread talks to it through thread-safe calls (`run`, `push_weights`); episodes run as
asyncio tasks inside the engine loop, so many multi-turn episodes stream concurrently.

Weights reach the engine in place, by the route chosen for it (`rollout/weights/`): it pauses with
in-flight requests kept and their KV cache cleared, loads the new weights, takes the new version
label and resumes, so a token's label is the version that sampled it. With LoRA adapters as
versions, each request runs under one adapter (`weights/adapters.py`).
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing.process
import shutil
import subprocess
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.rollout.engine.protocol import EngineLoop, EngineStartTimeout, TurnOutput, cancel_other_tasks
from lit_asyncrl.rollout.engine.settings import (
    EngineSettings,
    engine_core_environment,
    set_engine_log_level,
    vllm_config,
    vllm_device_type,
)
from lit_asyncrl.rollout.engine.start_report import end_processes, processes_made_since, where_the_start_stands
from lit_asyncrl.rollout.processes.reaper import start_reaper, stop_reaper
from lit_asyncrl.rollout.processes.spawn_environment import spawned_process_environment, standard_start_method
from lit_asyncrl.rollout.processes.temp_dirs import make_weights_dir, run_dir
from lit_asyncrl.rollout.weights.adapters import EngineAdapters
from lit_asyncrl.rollout.weights.choice import local_route
from lit_asyncrl.rollout.weights.route import WeightPush
from lit_asyncrl.rollout.weights.transfer import EngineWeightSyncClient

#: One `AsyncLLM` made at a time in a process: vLLM keeps process-wide state while it makes one
#: (metrics registry, current config, its engine core's environment), and two engines of one run
#: made at once have raced for it (seen: an engine failing to start, twice, one cause cut off).
_ENGINE_CREATION = threading.Lock()
#: How long a shutdown waits for a start that was given up (its processes ended) to fail.
_AFTER_GIVING_UP_S = 30.0
#: How often a launch looks for the engine's process (a start makes it within 0.3-5 s, measured).
_PROCESS_POLL_S = 0.01


class VLLMEngine(EngineLoop):
    """A vLLM `AsyncLLM` running on a background thread with its own asyncio loop (an `Engine`)."""

    def __init__(
        self, model_path: str | Path, settings: EngineSettings = EngineSettings(), *, seed: int = 0, max_loras: int = 4
    ) -> None:
        """`seed`: what the engine samples from; `max_loras`: with adapters as versions, the adapters one
        engine step may run at once (vLLM's `max_loras`: the live versions' and the newest)."""
        self.model_path = str(model_path)
        self.settings = settings
        self.seed = seed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._llm: Any = None
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        #: The child processes that lived as this engine's making began (its own are the others); None before
        #: it began (waiting for another engine's making to end, it has made nothing to end).
        self._children_before_start: set[multiprocessing.process.BaseProcess] | None = None
        self._start_given_up = False
        self._weights_dir = make_weights_dir()
        self._reaper: subprocess.Popen | None = None
        self.version = 0
        # Stall watch: requests in flight, when the engine last showed progress, whether it is paused.
        self._requests_in_flight = 0
        self._last_progress = time.monotonic()
        self._paused = False
        # With LoRA adapters as versions, each version is an adapter its requests run under.
        self._adapters = EngineAdapters(settings.lora, self._weights_dir) if settings.serves_adapters else None
        self._route = local_route(settings, self._adapters, max_loras)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, initial_version: int = 0, timeout_s: float = 300.0) -> None:
        """Start the engine thread and wait until the engine serves requests (within `timeout_s` in all)."""
        deadline = time.monotonic() + timeout_s
        self.launch(initial_version, timeout_s)
        self.wait_until_serving(max(deadline - time.monotonic(), 0.0))

    def launch(self, initial_version: int = 0, timeout_s: float = 300.0) -> None:
        """Start making the engine in the background; return once its process exists (`wait_until_serving`
        waits for the rest).

        Launched early, what the engine does once its process exists (loading the model, its first
        steps) overlaps with work the trainer does meanwhile (the warm start); vLLM's imports in
        this process, when the first engine brings them, come before (measured: a launch returned
        after 4.3-5.2 s in a default run, with no difference in its wall time that two runs each way
        could separate). Engines are made one at a time, so a second engine's launch also waits
        until the first serves (1.6 s more in a two-engine run).
        """
        self.version = initial_version
        self._children_before_start = None
        set_engine_log_level(self.settings.engine_log_level)
        standard_start_method()
        # Before the engine's processes exist: if this process is SIGKILLed, the reaper kills them
        # and removes the files vLLM made for them (sockets, rendezvous files: `temp_dirs.py`).
        self._reaper = start_reaper([self._weights_dir, run_dir()])
        self._thread = threading.Thread(target=self._thread_main, name="vllm-engine", daemon=True)
        self._thread.start()
        self._wait_for_engine_process(timeout_s)

    def _wait_for_engine_process(self, timeout_s: float) -> None:
        """Block until the start has made the engine's process, or ended, or `timeout_s` passed (then
        `wait_until_serving` reports where it stands).

        Until its process exists, the start adds names to this process's environment: the engine
        core's variables (`engine_core_environment`) and vLLM's own around its process start.
        glibc's setenv of a new name may move the environment's array, freeing the old one, while
        another thread's getenv walks it, and a tokenizer reads the environment at every batch it
        encodes: the warm start, tokenizing while two engines started, segfaulted in getenv (seen
        in CI, under DDP). After the spawn the start only restores or removes names, which frees
        and reallocates nothing. This covers the launching thread's own work; the episodes of
        engines already serving (an engine restarted beside them) run on their own threads.
        """
        deadline = time.monotonic() + timeout_s
        while not self._started.is_set() and self._thread.is_alive() and time.monotonic() < deadline:
            before = self._children_before_start
            if before is not None and processes_made_since(before):
                return
            time.sleep(_PROCESS_POLL_S)

    def wait_until_serving(self, timeout_s: float = 300.0) -> None:
        """Block until the launched engine serves requests; raise if its start failed."""
        if not self._started.wait(timeout_s):
            before = self._children_before_start
            made = processes_made_since(before) if before is not None else []
            report = where_the_start_stands(self._thread, made)
            # Ended, its processes make the blocked start fail, and the shutdown need not wait for it.
            end_processes(made)
            self._start_given_up = True
            raise EngineStartTimeout(f"vLLM engine did not start within {timeout_s} s ({report})")
        if self._startup_error is not None:
            # The cause in the message: under DDP the other ranks' reports can bury the chained one.
            cause = self._startup_error
            raise RuntimeError(f"vLLM engine failed to start: {type(cause).__name__}: {cause}") from cause

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

        config = vllm_config(
            self.model_path, self.settings, vllm_device_type(), self.seed, self._route.engine_arguments()
        )
        environment = engine_core_environment(self.settings, config)
        # No local name for the engine: vLLM's lazy imports can keep this frame alive until exit,
        # and an AsyncLLM still referenced then runs its __del__ against torn-down modules.
        with _ENGINE_CREATION, spawned_process_environment(environment):
            self._children_before_start = set(multiprocessing.active_children())
            self._llm = AsyncLLM.from_vllm_config(config)
        if self.settings.capture_routing:
            await self._llm.collective_rpc("start_routing_capture", args=(self.version,))
        await self._label_version(self.version)

    def shutdown(self, startup_timeout_s: float = 300.0) -> None:
        """Stop the engine, its process and its thread, and remove its temp dir; safe to call twice.

        Called while the engine is still starting (e.g. a signal during `start`), it first lets the start finish: vLLM's
        engine creation cannot be interrupted half-way, and shutting down a half-made engine from its own loop would
        cancel the start and strand the shutdown.
        """
        llm_ref = weakref.ref(self._llm) if self._llm is not None else None
        try:
            self._route.close()
            if self._start_given_up:
                startup_timeout_s = min(startup_timeout_s, _AFTER_GIVING_UP_S)
            if self._thread is not None and not self._started.wait(startup_timeout_s):
                raise TimeoutError(f"the vLLM engine neither started nor failed within {startup_timeout_s} s")
            if self._loop is not None and not self._loop.is_running() and self._llm is not None:
                # The start failed after the engine was made: shut it down here, no loop to use.
                llm = self._llm
                self._llm = None
                llm.shutdown()
                del llm
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
            if llm_ref is not None and llm_ref() is not None:
                # Still held, by a reference cycle: collect it now (left to interpreter exit, its __del__ runs
                # against torn-down modules). Usually nothing holds it by now, and a collection over a trainer's
                # heap costs ~0.5 s.
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
        if stalled_s > self.settings.engine_stall_timeout_s:
            self._stopped_answering = True
            return (
                f"it stopped answering: no output for {stalled_s:.0f} s with {self._requests_in_flight} "
                f"requests in flight (stall timeout {self.settings.engine_stall_timeout_s:g} s, "
                f"{config_key('rollout.engine_stall_timeout_s')})"
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
        llm = self._llm
        self._llm = None
        handler = getattr(llm, "output_handler", None)
        if handler is not None:
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
        # vLLM asks its engine core to stop and waits up to 5 s before killing it; one that stopped
        # answering will not stop on request, so it is killed at once (timeout 0).
        llm.shutdown(timeout=0 if self._stopped_answering else None)
        # Tasks still on this loop (cancelled episodes) end here, not in a __del__ at exit.
        await cancel_other_tasks()

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
        from vllm.inputs import TokensPrompt

        from lit_asyncrl.rollout.engine.settings import sampling_params

        async def stream(
            prompt: list[int], tokens: int, lora_request: Any, request_id: str
        ) -> tuple[list[int], list[float], Any]:
            params = sampling_params(tokens, temperature, top_k, stop_token_ids, ignore_eos)
            token_ids: list[int] = []
            logprobs: list[float] = []
            final = None
            outputs = self._llm.generate(
                TokensPrompt(prompt_token_ids=prompt), params, request_id=request_id, lora_request=lora_request
            )
            if self._requests_in_flight == 0:
                self._progress()  # an idle engine starts its stall clock with the first request
            self._requests_in_flight += 1
            try:
                async for message in outputs:
                    self._progress()
                    completion = message.outputs[0]
                    new_logprobs = [
                        entry[token].logprob for token, entry in zip(completion.token_ids, completion.logprobs or ())
                    ]
                    token_ids.extend(completion.token_ids)
                    logprobs.extend(new_logprobs)
                    if on_tokens is not None and completion.token_ids:
                        on_tokens(list(completion.token_ids), new_logprobs)
                    final = completion
            finally:
                self._requests_in_flight -= 1
            return token_ids, logprobs, final

        if self._adapters is not None:  # each request runs under one adapter
            token_ids, logprobs, versions, final = await self._adapters.generate(stream, prompt_ids, max_tokens)
        else:
            request_id = uuid.uuid4().hex
            token_ids, logprobs, final = await stream(list(prompt_ids), max_tokens, None, request_id)
            versions = expand_version_spans(final.weight_versions, len(token_ids), self.version)
        routing = None
        if self.settings.capture_routing and self._adapters is None:
            (recorded,) = await self._llm.collective_rpc("routed_experts_of", args=(request_id,))
            routing = {version: torch.tensor(experts, dtype=torch.int16) for version, experts in recorded.items()}
        return TurnOutput(token_ids, logprobs, versions, final.finish_reason if final else None, routing or None)

    # -- weights (called from the trainer thread) --------------------------------------------
    def push_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightPush:
        """Load `state_dict` into the engine in place by its route and label what follows `version`.

        Only the tensors written since this engine's last push travel (`weights/changed_tensors.py`).
        """
        return self._route.push(self, state_dict, version)

    @property
    def weights_dir(self) -> Path:
        """Where a route writes what the engine loads (a dir of this engine's in shared memory)."""
        return self._weights_dir

    def load_version(self, load: VersionLoad, version: int) -> float:
        """Load a version's weights and label what follows `version`: `load.prepare` while the
        engine generates, then pause -> `load.swap` -> label -> resume. Returns the seconds the
        engine stood still; bounded by the stall timeout, so a hung engine cannot hold the trainer."""
        return self.run(
            self._load_version(load, version), timeout_s=self.settings.engine_stall_timeout_s, stalled="a weight push"
        )

    async def _load_version(self, load: VersionLoad, version: int) -> float:
        await load.prepare(self._llm)
        started = time.perf_counter()
        try:
            await self._pause_generation()
            await load.swap(self._llm)
            await self._label_version(version)
        finally:
            await self._move_turns(resume=True)
        return time.perf_counter() - started

    def remove_adapter(self, lora_id: int) -> None:
        """Drop an adapter no longer needed, without waiting (the call queues behind the engine's steps)."""
        asyncio.run_coroutine_threadsafe(self._llm.remove_lora(lora_id), self.loop)

    def adapter_pushed(self, version: int) -> int | None:
        """The newest adapter is `version`'s: label what follows with it, and end a pause as a push of
        full weights does. Returns the turns moved to the new adapter (None when turns finish on
        their adapter, `model.lora.in_flight=finish`, and nothing was paused)."""
        self.version = version  # after the adapter is the newest: no token is older than its group's start
        if not (self._paused or self.settings.lora.moves_turns):
            return None
        return self.run(
            self._move_turns(resume=self._paused),
            timeout_s=self.settings.engine_stall_timeout_s,
            stalled="a weight push",
        )

    def trainer_address(self) -> str:
        """Where this engine's workers reach the trainer: this machine."""
        return "127.0.0.1"

    def weight_sync_client(self) -> EngineWeightSyncClient:
        """vLLM's weight-sync control plane of this engine, callable from the trainer thread."""
        return EngineWeightSyncClient(
            lambda step: self.run(step, timeout_s=self.settings.engine_stall_timeout_s, stalled="a weight push"),
            self._llm,
        )

    def set_version(self, version: int) -> None:
        """Label what the engine samples from now on `version` (after weights arrived another way)."""
        self.run(self._label_version(version), timeout_s=self.settings.engine_stall_timeout_s, stalled="a weight push")

    async def _label_version(self, version: int) -> None:
        """Tag what the engine computes from now on with `version`: vLLM's weight version on each sampled token,
        and the routing capture's version on each position it records."""
        await self._llm.update_weight_version(str(version))
        if self.settings.capture_routing:
            await self._llm.collective_rpc("set_routing_version", args=(version,))
        self.version = version

    def pause(self) -> None:
        """Freeze generation (in-flight requests kept, KV cleared) until `resume` or a weight push."""
        self.run(self._pause_generation(), timeout_s=self.settings.engine_stall_timeout_s, stalled="a pause")

    async def _pause_generation(self) -> None:
        self._paused = True
        await self._llm.pause_generation(mode="keep", clear_cache=True)

    def resume(self) -> None:
        self.run(self._move_turns(resume=True), timeout_s=self.settings.engine_stall_timeout_s, stalled="a resume")

    async def _move_turns(self, resume: bool) -> int:
        """Abort the turns moving to the newest adapter before generation resumes (`weights/adapters.py`)."""
        moving = self._adapters.requests_to_move() if self._adapters is not None else []
        if moving:
            # vLLM's requests, by the ids given to `generate` (vLLM 0.32's output processor keeps that map).
            held = self._llm.output_processor.external_req_ids
            await self._adapters.abort_once_held(moving, held, self._llm.abort)
        if resume:
            await self._llm.resume_generation()
            self._paused = False
            self._progress()
        return len(moving)


class VersionLoad(Protocol):
    """How a route's file becomes the engine's weights (`weights/file_routes.py`)."""

    async def prepare(self, llm: Any) -> None:
        """Work done while the engine still generates."""

    async def swap(self, llm: Any) -> None:
        """Work done while the engine stands still."""


def expand_version_spans(spans: Any, num_tokens: int, fallback: int) -> list[int]:
    """Per-token versions from vLLM's `(version, start, end)` spans over the generated tokens."""
    if not spans:
        return [fallback] * num_tokens
    versions = [fallback] * num_tokens
    for span in spans:
        version, start, end = (span.version, span.start, span.end) if hasattr(span, "version") else span
        versions[start:end] = [int(version)] * (end - start)
    return versions
