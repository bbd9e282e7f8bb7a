"""An engine's weight versions as vLLM LoRA adapters: one adapter per live version.

A push writes the version's adapter (peft's two files) and makes it the newest; neither the trainer
nor the engine waits for anything else. Each request is sent with the adapter that is newest when
it starts and runs under it to its end, so every token of a request carries that adapter's version
exactly. What a turn in flight at a push does (`LoRASettings.in_flight`):
- "finish": its request runs on to its end on the old adapter; the episode's next turn takes the
  new one. Nothing is recomputed, but a version's tokens keep coming after its adapter was replaced.
- "move": at the push its request is aborted (while the engine is paused, so no token comes from
  the old adapter after that) and the turn goes on as a new request under the new adapter, with
  the turn's tokens so far appended to the prompt: as with full weights, a version's tokens all
  exist when its weights leave, which is what interrupt_sync and the dedicated worker need. The
  price is the engine's prefill of the turn so far, once per turn in flight at each push.

The engine core loads an adapter from its files when the first request names it (between
two of its steps: measured in `benchmarks/bench_lora_push.py`), so a push does not wait behind the
engine's steps as `add_lora` would. An adapter leaves the engine (`remove_lora`, not waited for,
and its files deleted) at a later push, once it is not the newest and no request runs under it.

Every push gets a new LoRA id: vLLM keeps an adapter it has seen under its id, so the same version
pushed again (a resume, a restarted engine) must not reuse one.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import shutil
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Container, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from lit_asyncrl.models.lora import LoRASettings
from lit_asyncrl.rollout.weights.changed_tensors import WholeTensors
from lit_asyncrl.rollout.weights.route import WeightPush, WeightRoute

ADAPTER_FILE = "adapter_model.safetensors"


@dataclasses.dataclass(frozen=True)
class AdapterUse:
    """The adapter one request runs under: its LoRA id, its weight version, vLLM's LoRARequest."""

    lora_id: int
    version: int
    request: Any
    request_id: str = ""


#: `stream(prompt_ids, max_tokens, lora_request, request_id) -> (token_ids, logprobs, final output)`:
#: one engine request, its tokens passed on as they stream.
Stream = Callable[[list[int], int, Any, str], Awaitable[tuple[list[int], list[float], Any]]]


class EngineAdapters:
    """The adapters one engine holds, by LoRA id, with the requests running under each.

    `push` runs on the trainer's thread, `begin` and `end` on the engine's loop: a lock keeps a
    request from starting on an adapter that a push is letting go.
    """

    def __init__(self, settings: LoRASettings, directory: Path) -> None:
        self.settings = settings
        self.directory = directory
        self._requests: dict[int, Any] = {}  # LoRA id -> vLLM LoRARequest
        self._versions: dict[int, int] = {}  # LoRA id -> weight version
        self._in_flight: collections.Counter[int] = collections.Counter()
        self._running: dict[str, int] = {}  # request id -> LoRA id
        self._moved: set[str] = set()  # requests aborted to move their turn to the newest adapter
        self._newest: int | None = None
        self._last_id = 0
        self._lock = threading.Lock()

    def push(self, tensors: Mapping[str, torch.Tensor], version: int, remove: Callable[[int], None]) -> WeightPush:
        """Write the adapter of `version` and make it the newest; `remove(lora_id)` asks the engine
        to drop each adapter no longer needed. Nothing waits (no pause); `bytes`: the adapter's."""
        start = time.perf_counter()
        request, nbytes = self.write(tensors, version)
        with self._lock:
            self._requests[request.lora_int_id] = request
            self._versions[request.lora_int_id] = version
            self._newest = request.lora_int_id
            unused = [
                lora_id for lora_id in self._requests if lora_id != self._newest and self._in_flight[lora_id] == 0
            ]
            released = [self._requests.pop(lora_id) for lora_id in unused]
            for lora_id in unused:
                del self._versions[lora_id], self._in_flight[lora_id]
        for old in released:
            remove(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        return WeightPush(write_s=time.perf_counter() - start, bytes=nbytes)

    def write(self, tensors: Mapping[str, torch.Tensor], version: int) -> tuple[Any, int]:
        """The adapter of `version` as peft's files in a new folder: (its vLLM LoRARequest, its bytes)."""
        from vllm.lora.request import LoRARequest

        self._last_id += 1
        folder = self.directory / f"adapter-{self._last_id}-v{version}"
        folder.mkdir(parents=True)
        self.settings.peft_config().save_pretrained(str(folder))  # adapter_config.json
        tensors = {name: tensor.detach().to("cpu").contiguous().clone() for name, tensor in tensors.items()}
        save_file(tensors, str(folder / ADAPTER_FILE))
        request = LoRARequest(lora_name=f"v{version}-{self._last_id}", lora_int_id=self._last_id, lora_path=str(folder))
        return request, sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())

    def begin(self, request_id: str = "") -> AdapterUse:
        """Request `request_id` starts under the newest adapter."""
        with self._lock:
            if self._newest is None:
                raise RuntimeError("no adapter pushed yet: push the first version before generating")
            self._in_flight[self._newest] += 1
            self._running[request_id] = self._newest
            return AdapterUse(self._newest, self._versions[self._newest], self._requests[self._newest], request_id)

    def end(self, use: AdapterUse) -> None:
        """The request `use` was for has ended (its adapter may go at the next push)."""
        with self._lock:
            self._in_flight[use.lora_id] -= 1
            self._running.pop(use.request_id, None)

    def requests_to_move(self) -> list[str]:
        """With `in_flight="move"`: the requests running under an adapter other than the newest,
        marked as moved (the caller aborts them); none with "finish"."""
        if not self.settings.moves_turns:
            return []
        with self._lock:
            moving = [request_id for request_id, lora_id in self._running.items() if lora_id != self._newest]
            self._moved.update(moving)
            return moving

    async def abort_once_held(
        self, request_ids: list[str], held: Container[str], abort: Callable[[list[str]], Awaitable[None]]
    ) -> None:
        """`abort` each of `request_ids` (turns moving to the newest adapter) once it is in `held`,
        the engine's requests; one that ends before it gets there needs nothing.

        vLLM adds a request only after processing its input, and drops an abort of a request it
        does not hold yet: a turn that began just before a push would then run under the old
        adapter after it (seen: a group begun at a push sampled all four of its one-turn episodes
        under the version the dedicated worker had just left, so their tokens never got pi_old).
        While the engine is paused for the push, waiting for the add samples nothing."""
        waiting = set(request_ids)
        while waiting:
            added = [request_id for request_id in waiting if request_id in held]
            if added:
                await abort(added)
            with self._lock:
                waiting = {request_id for request_id in waiting.difference(added) if request_id in self._running}
            if waiting:
                await asyncio.sleep(0.001)

    async def generate(
        self, stream: Stream, prompt_ids: Sequence[int], max_tokens: int
    ) -> tuple[list[int], list[float], list[int], Any]:
        """One turn: a request under the newest adapter and, each time a push moves the turn, a
        request under the new one that continues it. Returns its tokens, mu, versions and vLLM's
        last output."""
        token_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        while True:
            use = self.begin(uuid.uuid4().hex)
            try:
                new_ids, new_logprobs, final = await stream(
                    [*prompt_ids, *token_ids], max_tokens - len(token_ids), use.request, use.request_id
                )
            finally:
                self.end(use)
            token_ids += new_ids
            logprobs += new_logprobs
            versions += [use.version] * len(new_ids)
            with self._lock:
                moved = use.request_id in self._moved
                self._moved.discard(use.request_id)
            # A request that ended on its own before the abort reached it is not continued.
            aborted = final is None or final.finish_reason == "abort"
            if not (moved and aborted and len(token_ids) < max_tokens):
                return token_ids, logprobs, versions, final

    @property
    def resident_versions(self) -> list[int]:
        """The versions whose adapters the engine holds now, oldest first."""
        with self._lock:
            return sorted(self._versions.values())


class AdapterRoute(WeightRoute):
    """Each version as a LoRA adapter the engine holds beside the base weights (`EngineAdapters`):
    nothing waits for the push, and the turns moving to the new adapter move at once.

    Args:
        adapters: the engine's adapters (its generation runs each request under one of them).
        max_loras: adapters one engine step may run at once (vLLM's `max_loras`); the live
            versions' adapters beyond it wait for a slot, not for a push.
    """

    def __init__(self, adapters: EngineAdapters, max_loras: int) -> None:
        super().__init__(WholeTensors())
        self.adapters = adapters
        self.max_loras = max_loras

    def engine_arguments(self) -> dict[str, Any]:
        # max_cpu_loras: the adapters kept loaded; an evicted one would be read again from its files.
        return {
            "enable_lora": True,
            "max_lora_rank": self.adapters.settings.engine_max_rank(),
            "max_loras": self.max_loras,
            "max_cpu_loras": self.max_loras,
        }

    def send(self, engine: Any, tensors: Mapping[str, torch.Tensor], version: int) -> WeightPush:
        pushed = self.adapters.push(tensors, version, engine.remove_adapter)
        return dataclasses.replace(pushed, moved_turns=engine.adapter_pushed(version))
