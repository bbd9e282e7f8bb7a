"""The rollout service under Lightning DDP: hosted on rank 0, its batches split over the ranks.

Where the engines live: with every rank's process on one node, the engines (and the dedicated
old-logit worker) belong to rank 0's service, and the other ranks reach them through collectives
of the trainer's own process group. One service means one buffer and one accounting: a batch is
taken once, on rank 0, and dealt out as disjoint whole groups, so each trajectory is trained
exactly once across ranks and group advantages stay computed over whole groups; DDP keeps the
replicas' weights equal, so one push per version (rank 0's) serves every rank. Engines on other
GPUs or nodes are the Ray placement's business (docs/scaling.md), behind the same protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.rollout.service import RolloutService, ScoreFn
from lit_asyncrl.rollout.weights.route import WeightPush


def check_batch_splits(groups_per_batch: int, world_size: int) -> None:
    """Every rank trains on the same number of whole groups: refuse a global batch that does not split."""
    if world_size > 1 and groups_per_batch % world_size != 0:
        raise ValueError(
            f"{config_key('rollout.groups_per_batch')}={groups_per_batch} is the global batch and must split into "
            f"whole groups over the {world_size} training processes (trainer.devices x trainer.num_nodes): "
            f"use a multiple of {world_size}"
        )


def split_by_groups(batch: dict, parts: int) -> list[dict]:
    """`batch` (the service's schema) as `parts` batches of whole, consecutive groups.

    Groups are dealt in order, the same number to each part (the first parts take one more when
    they do not split evenly); each part is trimmed to its own longest episode.
    """
    group_ids = batch["group_ids"]  # [B]
    firsts = torch.ones_like(group_ids, dtype=torch.bool)
    firsts[1:] = group_ids[1:] != group_ids[:-1]
    group_starts = torch.nonzero(firsts).flatten().tolist() + [len(group_ids)]
    num_groups = len(group_starts) - 1
    if len(set(group_ids.tolist())) != num_groups:
        raise ValueError("split_by_groups needs each group's episodes next to each other in the batch")
    sizes = [num_groups // parts + (1 if part < num_groups % parts else 0) for part in range(parts)]
    shards = []
    first_group = 0
    for size in sizes:
        rows = slice(group_starts[first_group], group_starts[first_group + size])
        first_group += size
        length = int(batch["attention_mask"][rows].sum(dim=1).max()) if rows.stop > rows.start else 0
        shard = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor) and value.dim() >= 2:  # [B, T, ...]: per position
                shard[key] = value[rows, :length]
            elif isinstance(value, torch.Tensor) and value.dim() == 1:
                shard[key] = value[rows]
            else:  # sampling settings, the same for every part
                shard[key] = value
        shards.append(shard)
    return shards


class RankZeroRollouts:
    """`RolloutService` on every DDP rank; rank 0's `service` is the real one, the others never start theirs.

    Each method is called by every rank at the same point of the loop (data loading, callback
    hooks), so the ones whose answer must agree across ranks are collectives: `next_batch`
    scatters rank 0's global batch as whole groups, `live_versions`, `stats`, `evaluate` and
    `score_unscored` broadcast rank 0's answer. Weights are pushed by rank 0 only. Object
    collectives run on a gloo group (the default one on CPU), so batches never need a GPU copy.

    Args:
        service: this rank's service (only rank 0's is started).
        rank, world_size: this process's global rank and the number of training processes.
    """

    def __init__(self, service: RolloutService, rank: int, world_size: int) -> None:
        self.service = service
        self.rank = rank
        self.world_size = world_size
        self.max_version_gap = service.max_version_gap
        self.weight_sync_every = service.weight_sync_every
        self.groups_per_batch = service.groups_per_batch
        self.checkpoint_pending = getattr(service, "checkpoint_pending", False)
        self._group: Any = None

    @property
    def is_host(self) -> bool:
        return self.rank == 0

    def configure(self, world_size: int, rank: int) -> RankZeroRollouts:
        return self  # configured when it was made

    def state_dict(self) -> dict:
        """The host's service holds the accounting (a checkpoint is written by rank 0)."""
        return self.service.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.service.load_state_dict(state)

    # -- collectives --------------------------------------------------------------------------
    def _process_group(self) -> Any:
        """Gloo for pickled objects; made on first use, which every rank reaches at the same call."""
        import torch.distributed as dist

        if self._group is None:
            self._group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
        return self._group

    def _broadcast(self, value: Any) -> Any:
        """Rank 0's `value` on every rank."""
        import torch.distributed as dist

        holder = [value if self.is_host else None]
        dist.broadcast_object_list(holder, src=0, group=self._process_group())
        return holder[0]

    def _scatter(self, values: list[Any] | None) -> Any:
        """Rank 0's `values[r]` on rank r."""
        import torch.distributed as dist

        received = [None]
        dist.scatter_object_list(received, values if self.is_host else None, src=0, group=self._process_group())
        return received[0]

    # -- the protocol -------------------------------------------------------------------------
    def use_dedicated_worker(self) -> None:
        self.service.use_dedicated_worker()  # records the choice; only the host starts the worker

    def launch_early(self) -> None:
        if self.is_host:
            self.service.launch_early()

    def start(self, weights: Mapping[str, torch.Tensor], version: int, train: bool = True) -> None:
        weights = whole_tensors(weights)  # every rank joins the gathers of sharded (FSDP2) weights
        if self.is_host:
            self.service.start(weights, version, train)

    def next_batch(self, timeout_s: float) -> dict:
        shards = split_by_groups(self.service.next_batch(timeout_s), self.world_size) if self.is_host else None
        return self._scatter(shards)

    def publish_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> WeightPush | None:
        # DDP keeps every replica's weights equal: the host's push serves all ranks.
        if version % self.service.weight_sync_every == 0:
            weights = whole_tensors(weights)
        return self.service.publish_weights(weights, version) if self.is_host else None

    def live_versions(self) -> list[int]:
        return self._broadcast(self.service.live_versions() if self.is_host else None)

    def pause(self) -> None:
        if self.is_host:
            self.service.pause()

    def resume(self) -> None:
        if self.is_host:
            self.service.resume()

    def score_unscored(self, score_fn: ScoreFn, version: int) -> int:
        # The unfinished episodes live in the host's service; its weights equal every rank's.
        return self._broadcast(self.service.score_unscored(score_fn, version) if self.is_host else None)

    def evaluate(self, instances: Sequence[Any], samples: int, timeout_s: float) -> dict[str, torch.Tensor]:
        # Every rank asks for the same chunk; the host plays it and all ranks log the same values
        # (means over ranks are unchanged by the duplicates).
        return self._broadcast(self.service.evaluate(instances, samples, timeout_s) if self.is_host else None)

    def stats(self) -> dict[str, float]:
        return self._broadcast(self.service.stats() if self.is_host else None)

    def close(self) -> None:
        self.service.close()  # no collective: close runs on every way out, failures included


def whole_tensors(weights: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
    """`weights` with each sharded tensor (FSDP2's DTensor) gathered whole.

    Gathering is a collective: every rank runs it, in the same order, though only rank 0 pushes
    the result. Plain tensors (DDP, one process) are returned as they are, without a copy.
    """
    from vllm.distributed.weight_transfer.base import materialize_full_tensor

    if not any(callable(getattr(tensor, "full_tensor", None)) for tensor in weights.values()):
        return weights
    return {name: materialize_full_tensor(tensor) for name, tensor in weights.items()}
