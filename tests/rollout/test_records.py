"""Trajectory records, GRPO advantages and collation into [B, T] tensors."""

import torch

from lit_asyncrl.rollout.records import (
    NO_VERSION,
    Trajectory,
    collate,
    reward_term_columns,
)


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


def test_a_dataset_tasks_reward_functions_become_one_column_each_nan_where_unscored():
    scored = Trajectory(group_id=0)
    scored.record_step_info({"rewards": {"exact": 1.0, "length": None}, "reward_failures": ["broken"]})
    other_task = Trajectory(group_id=0)
    other_task.record_step_info({"tool_calls": {"lookup": 1}})
    later = Trajectory(group_id=1)
    later.record_step_info({"rewards": {"exact": 0.0, "length": -2.0}, "reward_failures": []})
    later.record_step_info({"rewards": {"exact": 0.5, "length": None}})  # a second step adds to the first
    columns = reward_term_columns([scored, other_task, later])
    assert sorted(columns) == [
        "reward_failed/broken",
        "reward_failed/exact",
        "reward_failed/length",
        "reward_value/broken",
        "reward_value/exact",
        "reward_value/length",
    ]
    nan = float("nan")
    torch.testing.assert_close(
        columns["reward_value/exact"], torch.tensor([1.0, nan, 0.5], dtype=torch.float64), equal_nan=True
    )
    torch.testing.assert_close(
        columns["reward_value/length"], torch.tensor([nan, nan, -2.0], dtype=torch.float64), equal_nan=True
    )
    assert columns["reward_failed/broken"].tolist() == [1.0, 0.0, 0.0]
    assert reward_term_columns([other_task]) == {}


def _routing(rows: list[list[list[int]]]) -> torch.Tensor:
    """[positions, layers, top_k] int16, as the engine records it."""
    return torch.tensor(rows, dtype=torch.int16)


def test_each_version_keeps_its_own_routing_and_a_later_computation_under_one_version_wins():
    trajectory = Trajectory(group_id=0)
    trajectory.extend_context([1, 16])
    trajectory.extend_policy([7, 13], [-0.1, -0.2], [0, 0])
    # Turn 1's request under version 0: positions 0-2 computed (the last sampled token never is), one layer, top-2.
    trajectory.record_routing({0: _routing([[[0, 1]], [[2, 3]], [[4, 5]], [[-1, -1]]])})
    trajectory.extend_context([19])
    trajectory.extend_policy([8, 9], [-0.3, -0.4], [0, 1])
    # Turn 2's request: positions 0-1 from the prefix cache (-1) and 2-4 computed under version 0; then a push
    # computed positions 0-5 again under version 1.
    trajectory.record_routing(
        {
            0: _routing([[[-1, -1]], [[-1, -1]], [[6, 7]], [[0, 2]], [[1, 3]], [[-1, -1]]]),
            1: _routing([[[3, 4]], [[5, 6]], [[7, 0]], [[1, 2]], [[3, 5]], [[2, 6]], [[-1, -1]]]),
        }
    )
    assert trajectory.routed_experts.keys() == {0, 1}
    # Under version 0, position 2 computed again in turn 2 takes that routing; 0-1 keep turn 1's.
    assert trajectory.routed_experts[0].tolist() == [[[0, 1]], [[2, 3]], [[6, 7]], [[0, 2]], [[1, 3]], [[-1, -1]]]
    assert trajectory.routed_experts[1].tolist() == [
        [[3, 4]],
        [[5, 6]],
        [[7, 0]],
        [[1, 2]],
        [[3, 5]],
        [[2, 6]],
        [[-1, -1]],
    ]


def test_the_batch_carries_each_positions_routing_per_version_padded_with_none_and_nothing_without_one():
    routed = Trajectory(group_id=0)
    routed.extend_context([1, 16, 5])
    routed.extend_policy([7], [-0.1], [3])
    # Two layers; version 2 computed positions 0-1, version 3 positions 0-2.
    routed.record_routing(
        {
            3: _routing([[[1, 2], [3, 4]], [[5, 6], [7, 0]], [[2, 4], [6, 1]]]),
            2: _routing([[[0, 1], [2, 3]], [[4, 5], [6, 7]]]),
        }
    )
    other = Trajectory(group_id=1)
    other.extend_context([1, 8])
    other.extend_policy([4], [-0.2], [3])
    other.record_routing({3: _routing([[[7, 6], [5, 4]]])})
    restored = Trajectory(group_id=0)  # an episode restored without its routing
    restored.extend_context([1, 8])
    batch = collate([routed, other, restored], pad_id=0)
    none = [[-1, -1], [-1, -1]]
    assert batch["routed_experts"].dtype == torch.int16
    # [B, T, slots, layers, top_k], a row's slots in ascending version.
    assert batch["routed_experts"].tolist() == [
        [
            [[[0, 1], [2, 3]], [[1, 2], [3, 4]]],
            [[[4, 5], [6, 7]], [[5, 6], [7, 0]]],
            [none, [[2, 4], [6, 1]]],
            [none, none],
        ],
        [[[[7, 6], [5, 4]], none], [none, none], [none, none], [none, none]],
        [[none, none]] * 4,
    ]
    assert batch["routed_experts_versions"].tolist() == [
        [[2, 3], [2, 3], [-1, 3], [-1, -1]],
        [[3, -1], [-1, -1], [-1, -1], [-1, -1]],
        [[-1, -1]] * 4,
    ]
    assert "routed_experts" not in collate([restored], pad_id=0)
