"""How the trainer's weights reach a vLLM engine: which route a run uses, and the trainer side of
vLLM's weight-transfer API.

Routes (`rollout.weight_transfer`):
- `file`: write a safetensors file to shared memory; the engine reloads it (`reload_weights`).
- `gloo`: vLLM's weight-transfer API over a gloo group (`gloo_weight_transfer.py`); CPU or GPU.
- `nccl`: vLLM's NCCL backend; the engine on GPUs of its own (NCCL cannot put two ranks on one GPU).
- `ipc`: vLLM's CUDA IPC backend; the engine on the trainer's GPU, reading its tensors in place.
- `auto`: `file` on CPU; on GPUs `ipc` for one trainer process beside a local engine, else `nccl`.

On CPU the two routes take about as long in all (`benchmarks/bench_weight_push.py`), but `file`
writes while the engine still generates and `gloo` sends while it stands still (SmolLM2-135M: the
engine paused 0.63 s against 1.43 s), so `auto` keeps `file` there.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from lit_asyncrl.config_keys import config_key

WEIGHT_TRANSFERS = ("auto", "file", "staged", "gloo", "nccl", "ipc")
#: Routes that hand the engine a weights file (`staged`: prepared while it generates, `staged_weights.py`).
FILE_ROUTES = ("file", "staged")
_GPU_ONLY = ("nccl", "ipc")


def trainer_device_type() -> str:
    """Where the trainer's tensors live: "cuda" where a GPU is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_changed_elements(push_changed_elements: bool, route: str) -> None:
    """Changed elements are written into the engine's own copy of each tensor by the staged push's
    engine side: refused on any other route, naming both keys."""
    if push_changed_elements and route != "staged":
        raise ValueError(
            f"{config_key('rollout.push_changed_elements')}=true needs {config_key('rollout.weight_transfer')}=staged (got {route})"
        )


def select_weight_transfer(requested: str, device_type: str, placement: str, trainer_processes: int) -> str:
    """The route for `rollout.weight_transfer=requested`, or a ValueError naming what to change.

    `device_type` is vLLM's platform ("cuda", "cpu", ...), `placement` is `rollout.placement`,
    `trainer_processes` the trainer's world size (only rank 0 pushes weights; see distributed.py).
    """
    if requested not in WEIGHT_TRANSFERS:
        raise ValueError(f"{config_key('rollout.weight_transfer')}={requested!r}: choose one of {', '.join(WEIGHT_TRANSFERS)}")
    if requested == "auto":
        if device_type != "cuda":
            return "file"
        return "ipc" if placement == "local" and trainer_processes == 1 else "nccl"
    if requested == "staged" and (device_type != "cpu" or placement != "local"):
        raise ValueError(
            f"{config_key('rollout.weight_transfer')}=staged packs weights for vLLM's CPU kernels in a local engine "
            f"(this machine's vLLM platform is {device_type!r}, {config_key('rollout.placement')}={placement}); use file"
        )
    if requested in _GPU_ONLY and device_type != "cuda":
        raise ValueError(
            f"{config_key('rollout.weight_transfer')}={requested} needs CUDA GPUs (this machine's vLLM platform is {device_type!r}); use gloo or file"
        )
    if requested == "ipc" and placement != "local":
        raise ValueError(
            f"{config_key('rollout.weight_transfer')}=ipc shares the trainer's GPU memory with an engine on the same machine; "
            f"with {config_key('rollout.placement')}=ray use nccl"
        )
    if requested == "ipc" and trainer_processes > 1:
        # vLLM's IPC sender all-gathers handles from every process of the default group, but the
        # engines here are fed by rank 0 alone: the other ranks would never join that gather.
        raise ValueError(
            f"{config_key('rollout.weight_transfer')}=ipc with {trainer_processes} trainer processes: only rank 0 pushes weights here; use nccl"
        )
    return requested


EMBEDDING, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def weights_for_engine(state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors an engine loads: whole (an FSDP shard is gathered), detached, in the engine's dtype.

    A tied embedding travels once, as the head: vLLM's Llama-family loaders write `lm_head.weight`
    into the parameter the head shares with the embedding and re-pack the head from it, while a
    reload of the embedding alone leaves the re-packed head as it was (the logits silently wrong).
    Checked on the real engine for both routes (`test_engine_versions.py`)."""
    from vllm.distributed.weight_transfer.base import materialize_full_tensor

    named = dict(state_dict)
    if EMBEDDING in named and (HEAD not in named or _same_tensor(named[HEAD], named[EMBEDDING])):
        named[HEAD] = named.pop(EMBEDDING)
    return {name: materialize_full_tensor(tensor).detach().to(dtype=dtype) for name, tensor in named.items()}


def _same_tensor(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether two entries of a state dict are one tied parameter (a state dict lists it under both names)."""
    from torch.distributed.tensor import DTensor

    if first is second:
        return True
    if isinstance(first, DTensor) or isinstance(second, DTensor):  # shards: tied only when one object
        return False
    return first.device == second.device and first.data_ptr() == second.data_ptr() and first.shape == second.shape


def write_weights_file(
    state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype, directory: Path, encode: Callable | None = None
) -> tuple[Path, int]:
    """The file routes' trainer side: the engine's tensors as `model.safetensors` in `directory`
    (the path and the bytes written); `encode` turns them into the file's entries (`changed_elements.py`)."""
    from safetensors.torch import save_file

    tensors = weights_for_engine(state_dict, dtype)
    tensors = {name: tensor.to("cpu").contiguous().clone() for name, tensor in (encode(tensors) if encode else tensors).items()}
    path = directory / "model.safetensors"
    save_file(tensors, str(path))
    return path, sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())


def expand_version_spans(spans: Any, num_tokens: int, fallback: int) -> list[int]:
    """Per-token versions from vLLM's `(version, start, end)` spans over the generated tokens."""
    if not spans:
        return [fallback] * num_tokens
    versions = [fallback] * num_tokens
    for span in spans:
        version, start, end = (span.version, span.start, span.end) if hasattr(span, "version") else span
        versions[start:end] = [int(version)] * (end - start)
    return versions


def _weight_source_class() -> type:
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class StateDictSource(WeightSource):
        """vLLM's `WeightSource` over the latest state dict handed to `set`."""

        def __init__(self, dtype: torch.dtype) -> None:
            self.dtype = dtype
            self.tensors: dict[str, torch.Tensor] = {}

        def set(self, state_dict: Mapping[str, torch.Tensor]) -> None:
            self.tensors = weights_for_engine(state_dict, self.dtype)

        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(name, tensor.dtype, tuple(tensor.shape)) for name, tensor in self.tensors.items()]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            return iter(list(self.tensors.items()))

    return StateDictSource


class EngineWeightSyncClient:
    """vLLM's `VLLMWeightSyncClient` for an `AsyncLLM` on another thread's loop.

    `run(coroutine)` waits for a coroutine on the engine's loop (the engine's own `run`, which
    reports a dead engine by name); `llm` is the `AsyncLLM`.
    """

    def __init__(self, run: Callable[[Coroutine[Any, Any, Any]], Any], llm: Any) -> None:
        self._run = run
        self._llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        self._run(self._llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info)))

    def start_weight_update(self) -> None:
        self._run(self._llm.start_weight_update())

    def update_weights(self, update_info: Any) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        self._run(self._llm.update_weights(WeightTransferUpdateRequest(update_info=update_info)))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._run(self._llm.finish_weight_update(weight_version))


class WeightSender:
    """The trainer side of one engine's weight transfer over vLLM's API (`gloo`, `nccl`, `ipc`).

    Connects on first use (the engine must be serving): `push` then hands the latest weights to
    vLLM's trainer engine, which runs start -> update -> finish against the engine's workers.
    """

    def __init__(self, backend: str, dtype: torch.dtype, engine_workers: int, address: str = "127.0.0.1") -> None:
        self.backend = backend
        self.engine_workers = engine_workers
        self.address = address
        self.source = _weight_source_class()(dtype)
        self._trainer_engine: Any = None

    def init_info(self) -> Any:
        """vLLM's trainer init info for this backend (this process is the sender, rank 0)."""
        if self.backend == "ipc":
            from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

            return IPCTrainerInitInfo(rank=0)
        from vllm.utils.network_utils import get_open_port

        port, world_size = get_open_port(), 1 + self.engine_workers
        if self.backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

            return NCCLTrainerInitInfo(master_address=self.address, master_port=port, world_size=world_size, rank=0)
        from lit_asyncrl.rollout.weights.gloo import GlooTrainerInitInfo, register

        register()  # this process's factory; the engine's process registers through the plugin
        return GlooTrainerInitInfo(master_address=self.address, master_port=port, world_size=world_size, rank=0)

    def push(self, state_dict: Mapping[str, torch.Tensor], client: Any) -> int:
        """Send `state_dict` to the engine's workers (the engine paused by the caller); the bytes sent."""
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        self.source.set(state_dict)
        if self._trainer_engine is None:
            self._trainer_engine = WeightTransferTrainerFactory.trainer_init(self.init_info(), client=client, source=self.source)
        self._trainer_engine.send_weights()
        nbytes = sum(tensor.numel() * tensor.element_size() for tensor in self.source.tensors.values())
        self.source.tensors = {}  # the trainer's tensors are not kept past the push
        return nbytes

    def close(self) -> None:
        if self._trainer_engine is not None:
            self._trainer_engine.shutdown()
            self._trainer_engine = None
