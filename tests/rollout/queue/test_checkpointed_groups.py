"""Episodes written into a checkpoint and read back (`rollout/queue/checkpointed_groups.py`)."""

import io

import torch

from lit_asyncrl.rollout.queue.checkpointed_groups import groups_from_state, groups_to_state
from lit_asyncrl.rollout.records import Trajectory


def test_an_episodes_recorded_routing_survives_a_checkpoint_as_lightning_loads_it():
    trajectory = Trajectory(group_id=3)
    trajectory.extend_context([1, 16])
    trajectory.extend_policy([7], [-0.1], [2])
    trajectory.record_routing({2: torch.tensor([[[0, 1]], [[2, 3]]], dtype=torch.int16)})
    trajectory.tool_calls["lookup"] += 1
    saved = io.BytesIO()
    torch.save({"pending_groups": groups_to_state([[trajectory]])}, saved)
    saved.seek(0)
    # Lightning loads a checkpoint with `weights_only=True` under torch >= 2.6: tensors, lists and dicts only.
    state = torch.load(saved, weights_only=True)
    [[restored]] = groups_from_state(state["pending_groups"])
    assert restored.routed_experts.keys() == {2}
    assert torch.equal(restored.routed_experts[2], trajectory.routed_experts[2])
    assert restored.token_ids == [1, 16, 7] and restored.versions == trajectory.versions
    assert restored.tool_calls == {"lookup": 1}


def test_an_episode_from_a_checkpoint_written_before_routings_per_version_loads_without_one():
    trajectory = Trajectory(group_id=1)
    trajectory.extend_context([1, 16])
    [[dense, moe]] = groups_to_state([[trajectory, trajectory]])
    dense["routed_experts"] = None  # as a dense policy's episode was written
    moe["routed_experts"] = torch.tensor([[[0, 1]], [[2, 3]]], dtype=torch.int16)  # one routing for all versions
    [[restored_dense, restored_moe]] = groups_from_state([[dense, moe]])
    assert restored_dense.routed_experts == {} and restored_moe.routed_experts == {}
    assert restored_moe.token_ids == [1, 16]
