"""A `gloo` backend for vLLM's weight-transfer API: the trainer broadcasts its weights to the
engine's workers over a gloo process group, on machines without a GPU.

vLLM ships NCCL and CUDA IPC backends for its weight-transfer API (`init_weight_transfer_engine`,
`start_weight_update`, `update_weights`, `finish_weight_update`); both need CUDA. This backend has
the same shape as the dense NCCL one (a TCP rendezvous, the trainer as rank 0, the workers after
it, each tensor broadcast and loaded through vLLM's layerwise reload), so on CPU the project drives
vLLM's real weight-update path end to end, and on GPUs only the backend name changes.

vLLM creates the worker side inside its engine-core process, so the backend is registered there
through vLLM's plugin entry point (`vllm.general_plugins` in pyproject.toml calls `register`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Self

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.weight_transfer import WeightTransferConfig

BACKEND = "gloo"
#: How long either side waits for the other at the rendezvous and in each broadcast.
TIMEOUT = timedelta(seconds=300)
#: Tensors travel packed into buffers of up to this size: one broadcast per buffer rather than one
#: per tensor (each costs a round trip), while the receiving side holds one buffer at a time.
PACK_BYTES = 256 * 2**20


def pack_plan(dtypes: list[torch.dtype], shapes: list[list[int]], limit_bytes: int = PACK_BYTES) -> list[list[int]]:
    """Indices of the tensors in each packed buffer: consecutive tensors of one dtype, at most
    `limit_bytes` together (a larger tensor travels alone). Both sides compute it from the same
    announced metadata, so they cut the stream at the same places."""
    plan: list[list[int]] = []
    size = 0
    for index, (dtype, shape) in enumerate(zip(dtypes, shapes)):
        nbytes = math.prod(shape) * dtype.itemsize
        if not plan or dtypes[plan[-1][0]] != dtype or size + nbytes > limit_bytes:
            plan.append([])
            size = 0
        plan[-1].append(index)
        size += nbytes
    return plan


@dataclasses.dataclass
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    """Worker side: where the trainer's rendezvous listens and this engine's ranks in the group."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int


@dataclasses.dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    """Trainer side: the rendezvous the trainer (rank 0) opens; `world_size` = 1 + the engine's workers."""

    backend: ClassVar[str] = BACKEND
    master_address: str
    master_port: int
    world_size: int


@dataclasses.dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """One round: the tensors that follow, in broadcast order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                "names, dtype_names and shapes differ in length: "
                f"{len(self.names)}, {len(self.dtype_names)}, {len(self.shapes)}"
            )


def _open_group(address: str, port: int, rank: int, world_size: int) -> Any:
    # vLLM's own stateless group: it leaves torch.distributed's default group alone, which a DDP
    # trainer (and vLLM's own workers) already use.
    from vllm.distributed.utils import stateless_init_torch_distributed_process_group

    return stateless_init_torch_distributed_process_group(
        address, port, rank, world_size, backend="gloo", timeout=TIMEOUT
    )


class GlooWeightTransferEngine(WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]):
    """Worker side, inside vLLM's engine process: receives each tensor and loads it."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo
    supports_draft_weight_update = False

    def __init__(
        self, config: WeightTransferConfig, vllm_config: VllmConfig, device: torch.device, model: torch.nn.Module
    ) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: Any = None

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        parallel = self.parallel_config
        worker_rank = parallel.data_parallel_index * parallel.world_size + parallel.rank
        self.group = _open_group(
            init_info.master_address, init_info.master_port, init_info.rank_offset + worker_rank, init_info.world_size
        )

    def start_weight_update(self) -> None:
        # Checkpoint-format weights go through vLLM's layerwise reload, as with its NCCL backend:
        # it re-runs each layer's post-load processing (CPU weight packing included).
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which a CPU build cannot run;
        # gloo's broadcasts are complete once waited for.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer used before init_weight_transfer_engine")
        dtypes = [getattr(torch, name) for name in update_info.dtype_names]
        for indices in pack_plan(dtypes, update_info.shapes):
            sizes = [math.prod(update_info.shapes[i]) for i in indices]
            buffer = torch.empty(sum(sizes), dtype=dtypes[indices[0]])
            self.group.broadcast(buffer, 0).wait()
            pieces = buffer.split(sizes)
            self.model.load_weights(
                [(update_info.names[i], piece.view(update_info.shapes[i])) for i, piece in zip(indices, pieces)]
            )

    def shutdown(self) -> None:
        self.group = None


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine[GlooTrainerInitInfo]):
    """Trainer side: opens the group as rank 0 and drives each round through the client."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client: VLLMWeightSyncClient, source: WeightSource, is_sender: bool = True) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.group: Any = None

    @classmethod
    def trainer_init(
        cls, init_info: GlooTrainerInitInfo, *, client: VLLMWeightSyncClient, source: WeightSource | None = None
    ) -> Self:
        if source is None:
            raise ValueError("the gloo weight transfer needs a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        if not engine.is_sender:
            return engine
        worker_info = GlooWeightTransferInitInfo(
            init_info.master_address, init_info.master_port, 1, init_info.world_size
        )
        # The workers block in init_weight_transfer_engine until every rank has joined, so the
        # request runs on a side thread while this side joins as rank 0.
        with ThreadPoolExecutor(max_workers=1) as side:
            joined = side.submit(client.init_weight_transfer_engine, dataclasses.asdict(worker_info))
            engine.group = _open_group(init_info.master_address, init_info.master_port, 0, init_info.world_size)
            joined.result()
        return engine

    def send_weights(self) -> None:
        assert self.source is not None
        if not self.is_sender:
            for _ in self.source:  # only keeps the trainer-side gathers in step
                pass
            return
        meta = self.source.metadata()
        update = GlooWeightTransferUpdateInfo(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
            shapes=[list(m.shape) for m in meta],
        )
        self.client.start_weight_update()
        # The workers receive inside update_weights, so it runs beside the broadcasts.
        side = ThreadPoolExecutor(max_workers=1)
        try:
            received = side.submit(self.client.update_weights, dataclasses.asdict(update))
            tensors = [tensor for _, tensor in _checked(self.source, meta)]
            for indices in pack_plan([m.dtype for m in meta], update.shapes):
                if received.done():  # the request failed before its first receive
                    received.result()
                self.group.broadcast(torch.cat([tensors[i].reshape(-1) for i in indices]), 0).wait()
            received.result()
        finally:
            # A failed broadcast leaves the worker waiting inside its receive: do not join it.
            side.shutdown(wait=False)
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.group = None


def _checked(source: WeightSource, meta: list[ParamMeta]) -> Iterator[tuple[str, torch.Tensor]]:
    """The source's tensors, each checked against what the workers were told to expect: a mismatch
    would have both sides wait for broadcasts the other never makes."""
    for index, ((name, tensor), expected) in enumerate(zip(source, meta, strict=True)):
        if (name, tensor.dtype, tuple(tensor.shape)) != (expected.name, expected.dtype, expected.shape):
            raise ValueError(
                f"weight {index}: announced {expected.name} {expected.dtype} {expected.shape}, "
                f"sent {name} {tensor.dtype} {tuple(tensor.shape)}"
            )
        yield name, tensor


def register() -> None:
    """vLLM plugin hook (run in every vLLM process): make `gloo` a weight-transfer backend."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    for factory, engine in (
        (WeightTransferEngineFactory, GlooWeightTransferEngine),
        (WeightTransferTrainerFactory, GlooTrainerWeightTransferEngine),
    ):
        # Registered already: vLLM may load its plugins more than once in a process.
        with contextlib.suppress(ValueError):
            factory.register_engine(BACKEND, engine)
