"""The routes that hand the engine a weights file (`rollout.weight_transfer=file` and `staged`).

The trainer writes the version's tensors as a safetensors file in the engine's weights dir (shared
memory), while the engine still generates; the engine then loads it between a pause and a resume
(`VLLMEngine.load_version`). What differs is the load:
- `file`: vLLM's own reload (`reload_weights`) reads the file while the engine stands still;
- `staged`: a thread of the engine-core process prepares the file's tensors and kernels while the
  engine generates, and the pause only swaps them in (`staged.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from lit_asyncrl.kill_points import kill_if_asked
from lit_asyncrl.rollout.engine.settings import ENGINE_WORKER_EXTENSION
from lit_asyncrl.rollout.weights.changed_elements import ChangedElements
from lit_asyncrl.rollout.weights.changed_tensors import TensorSelection
from lit_asyncrl.rollout.weights.route import WeightPush, WeightRoute
from lit_asyncrl.rollout.weights.transfer import weights_for_engine

#: How often the trainer asks whether staging is done (each question waits for an engine step).
STAGED_POLL_S = 0.01


class ReloadFile:
    """vLLM's reload of the weights file at `path`, all of it while the engine stands still."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def prepare(self, llm: Any) -> None:
        """Nothing to do while the engine generates."""

    async def swap(self, llm: Any) -> None:
        await llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self.path.parent)})


class SwapStaged:
    """The weights file at `path` staged while the engine generates, swapped in while it stands still.

    With `elements`, the file may hold changed elements (`changed_elements.py`), written by the
    staging thread into the engine's own copy of each tensor."""

    def __init__(self, path: Path, elements: bool) -> None:
        self.path = path
        self.elements = elements

    async def prepare(self, llm: Any) -> None:
        await llm.collective_rpc("stage_weights", args=(str(self.path), self.elements))
        while not all(await llm.collective_rpc("staged_weights_ready")):
            await asyncio.sleep(STAGED_POLL_S)

    async def swap(self, llm: Any) -> None:
        await llm.collective_rpc("swap_staged_weights")


class FileRoute(WeightRoute):
    """The version as a weights file, reloaded by vLLM while the engine stands still.

    Args:
        selection: which tensors travel.
        dtype: the engine's dtype (the file's tensors are written in it).
    """

    def __init__(self, selection: TensorSelection, dtype: torch.dtype) -> None:
        super().__init__(selection)
        self.dtype = dtype

    def send(self, engine: Any, tensors: Mapping[str, torch.Tensor], version: int) -> WeightPush:
        start = time.perf_counter()
        path, nbytes = write_weights_file(tensors, self.dtype, engine.weights_dir, self.encode_entries)
        kill_if_asked("weight_push", version)
        pause_s = engine.load_version(self.load(path), version)
        return WeightPush(write_s=time.perf_counter() - start - pause_s, pause_s=pause_s, bytes=nbytes)

    def encode_entries(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The file's entries for `tensors`: the tensors themselves."""
        return dict(tensors)

    def load(self, path: Path) -> ReloadFile | SwapStaged:
        return ReloadFile(path)


class StagedRoute(FileRoute):
    """The version as a weights file, prepared inside the engine while it generates and swapped in.

    Args:
        selection: which tensors travel.
        dtype: the engine's dtype.
        elements: of the tensors that travel, only the elements whose bits changed (None: whole
            tensors; `rollout.push_changed_elements`).
    """

    def __init__(self, selection: TensorSelection, dtype: torch.dtype, elements: ChangedElements | None) -> None:
        super().__init__(selection, dtype)
        self.elements = elements

    def engine_arguments(self) -> dict[str, Any]:
        # vLLM's worker gains the staged push's methods (`collective_rpc("stage_weights", ...)`), among this library's.
        return {"worker_extension_cls": ENGINE_WORKER_EXTENSION}

    def encode_entries(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.elements is None:
            return dict(tensors)
        return self.elements.encode(tensors)

    def load(self, path: Path) -> SwapStaged:
        return SwapStaged(path, elements=self.elements is not None)


def write_weights_file(
    state_dict: Mapping[str, torch.Tensor],
    dtype: torch.dtype,
    directory: Path,
    encode: Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]],
) -> tuple[Path, int]:
    """The engine's tensors as `model.safetensors` in `directory` (the path and the bytes written);
    `encode` turns them into the file's entries (`changed_elements.py`)."""
    from safetensors.torch import save_file

    entries = encode(weights_for_engine(state_dict, dtype))
    tensors = {name: tensor.to("cpu").contiguous().clone() for name, tensor in entries.items()}
    path = directory / "model.safetensors"
    save_file(tensors, str(path))
    return path, sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
