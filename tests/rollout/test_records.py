"""Trajectory records, GRPO advantages and collation into [B, T] tensors."""

import pytest
import torch

from lit_asyncrl.rollout.records import NO_VERSION, Trajectory, collate, group_normalized_advantages


def test_group_normalized_advantages_by_hand():
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5 -> +1, -1, -1, +1
    assert group_normalized_advantages([1.0, 0.0, 0.0, 1.0]) == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    # equal rewards carry no signal
    assert group_normalized_advantages([0.3, 0.3]) == [0.0, 0.0]


def test_collate_pads_and_broadcasts_advantages_on_policy_tokens_only():
    first = Trajectory(group_id=0, advantage=2.0, reward=1.0, success=True)
    first.extend_context([1, 16])
    first.extend_policy([7, 13], [-0.1, -0.2], [3, 4])
    first.extend_context([19])
    second = Trajectory(group_id=0, advantage=-1.0)
    second.extend_context([1])
    second.extend_policy([8], [-0.3], [4])
    batch = collate([first, second], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 16, 7, 13, 19], [1, 8, 0, 0, 0]]
    assert batch["loss_mask"].tolist() == [[False, False, True, True, False], [False, True, False, False, False]]
    assert batch["versions"].tolist() == [
        [NO_VERSION, NO_VERSION, 3, 4, NO_VERSION],
        [NO_VERSION, 4, NO_VERSION, NO_VERSION, NO_VERSION],
    ]
    assert batch["advantages"].tolist() == [[0, 0, 2, 2, 0], [0, -1, 0, 0, 0]]
    assert torch.allclose(batch["behavior_logprobs"][0], torch.tensor([0, 0, -0.1, -0.2, 0]))
    assert batch["attention_mask"].tolist() == [[1] * 5, [1, 1, 0, 0, 0]]
    assert batch["success"].tolist() == [1.0, 0.0]
    assert first.oldest_version == 3 and first.num_policy_tokens == 2
