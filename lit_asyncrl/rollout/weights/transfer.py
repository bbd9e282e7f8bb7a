"""vLLM's weight-transfer API as routes (`rollout.weight_transfer=gloo`, `nccl`, `ipc`): the trainer
sends a version's tensors to the engine's workers while the engine stands still.

- `gloo`: a gloo group (`gloo.py`), CPU or GPU;
- `nccl`: vLLM's NCCL backend, the engine on GPUs of its own (NCCL cannot put two ranks on one GPU);
- `ipc`: vLLM's CUDA IPC backend, the engine on the trainer's GPU reading its tensors in place.

On CPU `file` and `gloo` take about as long in all (`benchmarks/bench_weight_push.py`), but `file`
writes while the engine still generates and `gloo` sends while it stands still (SmolLM2-135M: the
engine paused 0.63 s against 1.43 s), so `auto` picks `file` there (`choice.py`).
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, ClassVar

import torch

from lit_asyncrl.kill_points import kill_if_asked
from lit_asyncrl.rollout.weights.changed_tensors import TensorSelection
from lit_asyncrl.rollout.weights.route import WeightPush, WeightRoute

EMBEDDING = "model.embed_tokens.weight"
HEAD = "lm_head.weight"


def weights_for_engine(state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors an engine loads: whole (an FSDP shard is gathered), detached, in the engine's dtype,
    a tied embedding once (`tied_once`)."""
    from vllm.distributed.weight_transfer.base import materialize_full_tensor

    return {
        name: materialize_full_tensor(tensor).detach().to(dtype=dtype) for name, tensor in tied_once(state_dict).items()
    }


def tied_once(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` with a tied embedding named once, as the head.

    vLLM's Llama-family loaders write `lm_head.weight` into the parameter the head shares with the
    embedding and re-pack the head from it, while a reload of the embedding alone leaves the
    re-packed head as it was (the logits silently wrong). Checked on the real engine for every route
    (`test_engine_versions.py`). Done before a tensor leaves this process: a copy (through Ray's
    object store) no longer shares its storage, and the tie could not be seen any more."""
    named = dict(state_dict)
    if EMBEDDING in named and (HEAD not in named or _same_tensor(named[HEAD], named[EMBEDDING])):
        named[HEAD] = named.pop(EMBEDDING)
    return named


def _same_tensor(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether two entries of a state dict are one tied parameter (a state dict lists it under both names)."""
    from torch.distributed.tensor import DTensor

    if first is second:
        return True
    if isinstance(first, DTensor) or isinstance(second, DTensor):  # shards: tied only when one object
        return False
    return first.device == second.device and first.data_ptr() == second.data_ptr() and first.shape == second.shape


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


class TransferRoute(WeightRoute):
    """A backend of vLLM's weight-transfer API: the engine pauses, the tensors travel to its
    workers, the engine takes the new label and resumes.

    The trainer side connects at the first push (the engine must be serving) and then hands each
    version to vLLM's trainer engine, which runs start -> update -> finish against the workers.

    Args:
        selection: which tensors travel.
        dtype: the engine's dtype.
        engine_workers: vLLM's workers in the engine (each joins the group).
    """

    #: vLLM's name of the backend (`WeightTransferConfig.backend`).
    backend: ClassVar[str]

    def __init__(self, selection: TensorSelection, dtype: torch.dtype, engine_workers: int) -> None:
        super().__init__(selection)
        self.engine_workers = engine_workers
        #: Where the engine's workers reach this process (another node's address on a Ray cluster).
        self.address = "127.0.0.1"
        self.source = _weight_source_class()(dtype)
        self._trainer_engine: Any = None

    def engine_arguments(self) -> dict[str, Any]:
        from vllm.config import WeightTransferConfig

        return {"weight_transfer_config": WeightTransferConfig(backend=self.backend)}

    @abc.abstractmethod
    def trainer_init_info(self) -> Any:
        """vLLM's trainer init info for this backend (this process is the sender, rank 0)."""

    def send(self, engine: Any, tensors: Mapping[str, torch.Tensor], version: int) -> WeightPush:
        start = time.perf_counter()
        engine.pause()
        try:
            kill_if_asked("weight_push", version)
            nbytes = self.send_to(tensors, engine.weight_sync_client(), engine.trainer_address())
            engine.set_version(version)
        finally:
            if engine.dead_reason() is None:
                engine.resume()
        return WeightPush(pause_s=time.perf_counter() - start, bytes=nbytes)

    def send_to(self, tensors: Mapping[str, torch.Tensor], client: Any, address: str) -> int:
        """Send `tensors` through vLLM's weight-sync `client` (the engine paused); the bytes sent."""
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        self.source.set(tensors)
        if self._trainer_engine is None:
            self.address = address
            self._trainer_engine = WeightTransferTrainerFactory.trainer_init(
                self.trainer_init_info(), client=client, source=self.source
            )
        self._trainer_engine.send_weights()
        nbytes = sum(tensor.numel() * tensor.element_size() for tensor in self.source.tensors.values())
        self.source.tensors = {}  # the trainer's tensors are not kept past the push
        return nbytes

    def close(self) -> None:
        if self._trainer_engine is not None:
            self._trainer_engine.shutdown()
            self._trainer_engine = None

    def group_size(self) -> int:
        """The trainer and every engine worker."""
        return 1 + self.engine_workers


class GlooRoute(TransferRoute):
    """vLLM's weight-transfer API over a gloo group (`gloo.py`): CPU or GPU."""

    backend = "gloo"

    def trainer_init_info(self) -> Any:
        from vllm.utils.network_utils import get_open_port

        from lit_asyncrl.rollout.weights.gloo import GlooTrainerInitInfo, register

        register()  # this process's factory; the engine's process registers through the plugin
        return GlooTrainerInitInfo(
            master_address=self.address, master_port=get_open_port(), world_size=self.group_size(), rank=0
        )


class NCCLRoute(TransferRoute):
    """vLLM's NCCL backend: the engine on GPUs of its own."""

    backend = "nccl"

    def trainer_init_info(self) -> Any:
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo
        from vllm.utils.network_utils import get_open_port

        return NCCLTrainerInitInfo(
            master_address=self.address, master_port=get_open_port(), world_size=self.group_size(), rank=0
        )


class IPCRoute(TransferRoute):
    """vLLM's CUDA IPC backend: the engine on the trainer's GPU reads its tensors in place."""

    backend = "ipc"

    def trainer_init_info(self) -> Any:
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=0)
