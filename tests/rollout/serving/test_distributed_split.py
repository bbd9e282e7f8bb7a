"""Dealing a global batch over DDP ranks, and routing groups over engines (pure logic)."""

import pytest
import torch

from lit_asyncrl.rollout.records import Trajectory, collate
from lit_asyncrl.rollout.serving.distributed import check_batch_splits, split_by_groups
from lit_asyncrl.rollout.serving.lanes import lane_share
from lit_asyncrl.rollout.serving.routing import LeastLoadedRouter


def episode(group_id: int, length: int) -> Trajectory:
    trajectory = Trajectory(group_id=group_id)
    trajectory.extend_context([1, 2])
    trajectory.extend_policy([5] * length, [-0.5] * length, [group_id] * length)
    trajectory.advantage = float(group_id)
    return trajectory


def test_split_deals_whole_groups_in_order_and_trims_each_part():
    # Group 1 lost an episode to the environment; group 3 has the longest episode (2 + 6 tokens).
    lengths = {0: [1, 2, 1], 1: [1, 1], 2: [2, 2, 2], 3: [6, 1, 1]}
    trajectories = [episode(group, length) for group, group_lengths in lengths.items() for length in group_lengths]
    for trajectory in trajectories:  # an MoE's recorded routing: version -> [positions, layers, top_k]
        routing = torch.full((len(trajectory.token_ids), 2, 2), trajectory.group_id, dtype=torch.int16)
        trajectory.record_routing({trajectory.group_id: routing})
    batch = collate(trajectories, pad_id=0)
    batch["temperature"], batch["top_k"] = 0.9, -1

    first, second = split_by_groups(batch, 2)

    assert first["group_ids"].tolist() == [0, 0, 0, 1, 1]
    assert second["group_ids"].tolist() == [2, 2, 2, 3, 3, 3]
    assert first["input_ids"].shape == (5, 4) and second["input_ids"].shape == (6, 8)  # own longest episode
    assert torch.equal(first["input_ids"], batch["input_ids"][:5, :4])
    assert torch.equal(second["versions"], batch["versions"][5:])
    assert torch.equal(second["advantages"], batch["advantages"][5:])
    assert torch.equal(first["routed_experts"], batch["routed_experts"][:5, :4])  # [5, 4, 1, 2, 2]
    assert torch.equal(second["routed_experts"], batch["routed_experts"][5:])
    # Each row's positions under its group's version, NO_VERSION past its end (lengths 3, 4, 3, 3, 3).
    assert first["routed_experts_versions"][:, :, 0].tolist() == [
        [0, 0, 0, -1],
        [0, 0, 0, 0],
        [0, 0, 0, -1],
        [1, 1, 1, -1],
        [1, 1, 1, -1],
    ]
    assert first["rewards"].shape == (5,) and second["episode_s"].shape == (6,)
    assert first["temperature"] == second["temperature"] == 0.9 and second["top_k"] == -1
    # Nothing trimmed away was a token of the part.
    assert first["attention_mask"].sum() == batch["attention_mask"][:5].sum()


def test_split_into_more_parts_gives_the_first_parts_the_remainder():
    batch = collate([episode(group, 1) for group in range(5) for _ in range(2)], pad_id=0)
    parts = split_by_groups(batch, 3)
    assert [part["group_ids"].tolist() for part in parts] == [[0, 0, 1, 1], [2, 2, 3, 3], [4, 4]]


def test_split_refuses_a_group_spread_over_the_batch():
    batch = collate([episode(0, 1), episode(1, 1), episode(0, 1)], pad_id=0)
    with pytest.raises(ValueError, match="next to each other"):
        split_by_groups(batch, 2)


def test_a_global_batch_that_does_not_split_is_refused_naming_the_keys():
    check_batch_splits(groups_per_batch=4, world_size=2)
    check_batch_splits(groups_per_batch=3, world_size=1)
    with pytest.raises(ValueError, match=r"rollout.groups_per_batch=6 .* 4 training processes .* multiple of 4"):
        check_batch_splits(groups_per_batch=6, world_size=4)


def test_router_admits_only_the_least_loaded_engines():
    loads = [2, 1, 1]
    router = LeastLoadedRouter()
    for index in range(3):
        router.register(index, lambda index=index: loads[index])
    assert [router.admits(index) for index in range(3)] == [False, True, True]
    loads[1] = 3
    assert [router.admits(index) for index in range(3)] == [False, False, True]
    assert router.loads() == [2, 3, 1]


def test_share_deals_a_total_over_engines():
    assert [lane_share(16, lane, 3) for lane in range(3)] == [6, 5, 5]
    assert [lane_share(1, lane, 2, minimum=1) for lane in range(2)] == [1, 1]
    assert [lane_share(4, lane, 2) for lane in range(2)] == [2, 2]
