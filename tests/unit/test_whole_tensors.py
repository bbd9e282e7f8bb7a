"""FSDP2-sharded weights are gathered whole on every rank before rank 0 pushes them (two real gloo processes)."""

import os

import torch
import torch.multiprocessing as mp

from tests.support.xdist_groups import imports_vllm

pytestmark = imports_vllm  # the ranks gather with vLLM's helper: forked where vLLM is imported already


def _rank(rank: int, world_size: int, store_path: str, results: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from lit_asyncrl.rollout.serving.distributed import whole_tensors

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size)
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        full = torch.arange(12.0).reshape(4, 3)
        sharded = distribute_tensor(full, mesh, [Shard(0)])
        assert sharded.to_local().shape == (2, 3)  # each rank holds half the rows
        plain = torch.ones(2)
        gathered = whole_tensors({"w": sharded, "b": plain})
        torch.save(
            {"w": gathered["w"], "b_is_same": gathered["b"] is plain, "plain_untouched": whole_tensors({"b": plain})},
            f"{results}/{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def test_each_rank_gets_the_whole_tensor_and_plain_tensors_pass_through(tmp_path):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # Forked, the ranks start with this process's imports (spawned, each imported torch and the
    # test module again: 10 s of the fast suite's minute).
    mp.start_processes(
        _rank, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True, start_method="fork"
    )
    expected = torch.arange(12.0).reshape(4, 3)
    for rank in range(2):
        result = torch.load(tmp_path / f"{rank}.pt")
        assert torch.equal(result["w"], expected)
        assert type(result["w"]) is torch.Tensor  # a plain tensor the engine can load
        assert result["b_is_same"]
        assert torch.equal(result["plain_untouched"]["b"], torch.ones(2))
