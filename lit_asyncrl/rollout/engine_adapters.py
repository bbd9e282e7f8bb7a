"""An engine's weight versions as vLLM LoRA adapters: one adapter per live version.

A push writes the version's adapter (peft's two files) and loads it with `add_lora`; generation never
pauses for it. Each request is sent with the adapter that is newest when the request starts and
runs under it to its end, so every token of a turn carries that adapter's version exactly; a turn in
flight at a push finishes on its adapter and the episode's next turn takes the new one. An adapter
leaves the engine (`remove_lora`, its files deleted) at a later push, once it is not the newest and
no request runs under it.

Every load gets a new LoRA id: vLLM keeps an adapter it has seen under its id, so the same version
pushed again (a resume, a restarted engine) must not reuse one.
"""

from __future__ import annotations

import collections
import dataclasses
import shutil
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from lit_asyncrl.models.lora import LoRASettings

ADAPTER_FILE = "adapter_model.safetensors"


@dataclasses.dataclass(frozen=True)
class AdapterUse:
    """The adapter one request runs under: its LoRA id, its weight version, vLLM's LoRARequest."""

    lora_id: int
    version: int
    request: Any


class EngineAdapters:
    """The adapters one engine holds, by LoRA id, with the requests running under each.

    `write` runs on the trainer's thread; `load`, `begin` and `end` on the engine's loop (one
    thread, so the counts need no lock).
    """

    def __init__(self, settings: LoRASettings, directory: Path) -> None:
        self.settings = settings
        self.directory = directory
        self._requests: dict[int, Any] = {}  # LoRA id -> vLLM LoRARequest
        self._versions: dict[int, int] = {}  # LoRA id -> weight version
        self._in_flight: collections.Counter[int] = collections.Counter()
        self._newest: int | None = None
        self._last_id = 0

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

    async def load(self, llm: Any, request: Any, version: int) -> None:
        """Load the adapter `write` made as the newest version, then let go of the unused ones."""
        if not await llm.add_lora(request):
            raise RuntimeError(f"the vLLM engine did not load the adapter of version {version} from {request.lora_path}")
        lora_id = request.lora_int_id
        self._requests[lora_id], self._versions[lora_id] = request, version
        self._newest = lora_id
        for unused in [other for other in self._requests if other != lora_id and self._in_flight[other] == 0]:
            await llm.remove_lora(unused)
            shutil.rmtree(self._requests.pop(unused).lora_path, ignore_errors=True)
            del self._versions[unused]

    def push(
        self, run: Callable[[Coroutine[Any, Any, None]], None], llm: Any, tensors: Mapping[str, torch.Tensor], version: int
    ) -> dict[str, float]:
        """Write and load the adapter of `version` (`run` waits on the engine's loop): timings
        `write_s` and `pause_s` (the load's round trip: generation goes on, but the engine core
        loads the adapter between two of its steps) and the adapter's `bytes`."""
        start = time.perf_counter()
        request, nbytes = self.write(tensors, version)
        written = time.perf_counter()
        run(self.load(llm, request, version))
        return {"write_s": written - start, "pause_s": time.perf_counter() - written, "bytes": float(nbytes)}

    def begin(self) -> AdapterUse:
        """A request starts under the newest adapter."""
        if self._newest is None:
            raise RuntimeError("no adapter loaded yet: push the first version before generating")
        self._in_flight[self._newest] += 1
        return AdapterUse(self._newest, self._versions[self._newest], self._requests[self._newest])

    def end(self, use: AdapterUse) -> None:
        """The request `use` was for has ended (its adapter may go at the next push)."""
        self._in_flight[use.lora_id] -= 1

    @property
    def resident_versions(self) -> list[int]:
        """The versions whose adapters the engine holds now, oldest first."""
        return sorted(self._versions.values())
