"""Fully sharded training (FSDP2) through Lightning: `trainer.strategy=fsdp2`.

Lightning's `ModelParallelStrategy` runs torch's FSDP2 (`fully_shard`) on CPUs (gloo) and GPUs
(NCCL) and leaves the sharding to the module's `configure_model`; `FSDP2Strategy` is that strategy
with every process in one data-parallel group and no tensor parallelism, registered under the name
`fsdp2` so that both entry points take it as a string. Lightning's own `strategy=fsdp` (FSDP1)
accepts GPUs only.

Each parameter is then a DTensor holding this rank's shard. What reads whole weights gathers them
on every rank in the same order (a collective): the weight push (`rollout/serving/distributed.py`,
`whole_tensors`) and Lightning's checkpoint (one full file, as without sharding).
"""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import ModelParallelStrategy, StrategyRegistry

STRATEGY_NAME = "fsdp2"


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 over all training processes: `ModelParallelStrategy` with one data-parallel dimension.

    Args: those of `ModelParallelStrategy` other than the two parallel sizes. A checkpoint is one
    full file (`save_distributed_checkpoint=False`), which resuming and the tools read as usual.
    """

    strategy_name = STRATEGY_NAME

    def __init__(self, save_distributed_checkpoint: bool = False, **kwargs) -> None:
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            **kwargs,
        )

    def setup_environment(self) -> None:
        # ModelParallelStrategy's "auto" data-parallel size is the node count (it expects tensor
        # parallelism inside a node); here every process is a data-parallel shard.
        if self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()


def shard_policy(policy: torch.nn.Module, mesh) -> None:
    """Shard `policy` over `mesh` with FSDP2: each decoder layer, then the rest.

    The warm start runs on rank 0 only (it hosts the engines), so rank 0's weights are broadcast
    first: each rank keeps its shard of one common model (DDP makes the same copy when it wraps).
    """
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if is_sharded(policy):
        return
    group = mesh.get_group()
    for tensor in [*policy.parameters(), *policy.buffers()]:
        dist.broadcast(tensor.data, src=dist.get_global_rank(group, 0), group=group)
    for layer in _decoder_layers(policy):
        fully_shard(layer, mesh=mesh)
    fully_shard(policy, mesh=mesh)


def is_sharded(policy: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(parameter, DTensor) for parameter in policy.parameters())


def _decoder_layers(policy: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a Hugging Face causal LM (`model.layers`), each its own FSDP unit so
    that only one layer's full weights exist at a time."""
    layers = getattr(getattr(policy, "model", None), "layers", None)
    return list(layers) if layers is not None else []


def check_reference_supported(strategy: object, reference: object, fidelity: bool) -> None:
    """Refuse, before anything starts, a reference route not yet run under FSDP2.

    The snapshot, interruption-sync and EWMA routes keep or score with weight copies on one rank,
    and under FSDP2 a forward is a collective every rank must join: not yet made shard-aware.
    """
    from lit_asyncrl.reference.attached import InterruptSyncReference
    from lit_asyncrl.reference.ewma import EWMAReferenceSource
    from lit_asyncrl.reference.snapshot import SnapshotReference

    if not isinstance(strategy, FSDP2Strategy):
        return
    unsupported = {SnapshotReference: "snapshot", InterruptSyncReference: "interrupt_sync", EWMAReferenceSource: "ewma"}
    for cls, name in unsupported.items():
        if isinstance(reference, cls):
            raise ValueError(
                f"reference={name} under trainer.strategy={STRATEGY_NAME}: "
                "not supported yet (its callbacks are not shard-aware); "
                "use trainer.strategy=ddp, or reference=none, async_recompute or dedicated"
            )
    if fidelity:
        raise ValueError(
            f"fidelity=true under trainer.strategy={STRATEGY_NAME}: "
            "not supported yet (it keeps unsharded snapshots); use trainer.strategy=ddp"
        )


StrategyRegistry.register(
    STRATEGY_NAME, FSDP2Strategy, description="FSDP2 (fully_shard) over all processes, CPU or GPU", override=True
)
