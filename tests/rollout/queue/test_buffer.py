"""The buffer's accounting (produced = trained + dropped + pending) and its staleness cap."""

import threading

import pytest

from lit_asyncrl.rollout.queue.buffer import RolloutBuffer
from lit_asyncrl.rollout.records import Trajectory


def make_group(group_id: int, versions: list[list[int]]) -> list[Trajectory]:
    group = []
    for episode_versions in versions:
        trajectory = Trajectory(group_id=group_id)
        trajectory.extend_context([1])
        trajectory.extend_policy([5] * len(episode_versions), [-0.5] * len(episode_versions), episode_versions)
        group.append(trajectory)
    return group


def test_accounting_and_staleness_cap():
    buffer = RolloutBuffer(capacity=8, max_version_gap=2)
    for group_id, versions in enumerate([[[0, 0], [0]], [[0, 1], [1]], [[2], [2, 3]]]):
        assert buffer.try_reserve(2)
        buffer.put_group(make_group(group_id, versions), reserved=2)
    assert (buffer.produced, buffer.pending, buffer.trained, buffer.num_dropped) == (6, 6, 0, 0)

    # Trainer at version 3: group 0 (oldest token v0, gap 3 > 2) is stale; group 1 (oldest v0) too.
    buffer.set_trainer_version(3)
    assert buffer.dropped["stale"] == 4
    assert buffer.pending == 2
    assert buffer.accounting_holds()

    (taken,) = buffer.take(1, timeout_s=0.1)
    assert taken[0].group_id == 2
    assert (buffer.produced, buffer.trained, buffer.num_dropped, buffer.pending) == (6, 2, 4, 0)
    assert buffer.accounting_holds()


def test_a_token_exactly_at_the_gap_is_kept():
    buffer = RolloutBuffer(capacity=4, max_version_gap=3)
    buffer.try_reserve(1)
    buffer.put_group(make_group(0, [[1, 4]]), reserved=1)
    buffer.set_trainer_version(4)  # gap 3 == max: kept
    assert buffer.pending == 1
    buffer.set_trainer_version(5)  # gap 4: dropped
    assert (buffer.pending, buffer.dropped["stale"]) == (0, 1)


def test_capacity_counts_reserved_room_and_release_gives_it_back():
    buffer = RolloutBuffer(capacity=4, max_version_gap=0)
    assert buffer.try_reserve(2)
    assert buffer.try_reserve(2)
    assert not buffer.try_reserve(1)  # full: the engine must wait
    buffer.release(2)  # a cancelled group
    assert buffer.try_reserve(2)
    assert buffer.produced == 0 and buffer.accounting_holds()


def test_take_waits_for_the_producer_and_times_out():
    buffer = RolloutBuffer(capacity=4, max_version_gap=0)
    with pytest.raises(TimeoutError, match="1 rollout groups"):
        buffer.take(1, timeout_s=0.05)
    buffer.try_reserve(1)
    timer = threading.Timer(0.05, lambda: buffer.put_group(make_group(7, [[0]]), reserved=1))
    timer.start()
    (group,) = buffer.take(1, timeout_s=5)
    assert group[0].group_id == 7


@pytest.mark.parametrize(("capacity", "gap", "message"), [(0, 1, "capacity"), (4, -1, "max_version_gap")])
def test_bad_arguments_name_the_key(capacity, gap, message):
    with pytest.raises(ValueError, match=message):
        RolloutBuffer(capacity=capacity, max_version_gap=gap)


def test_accounting_carries_over_a_restart_with_the_lost_pending_episodes_counted():
    before = RolloutBuffer(capacity=16, max_version_gap=1)
    for group_id, versions in enumerate([[[0], [0]], [[0], [0]], [[1], [1]], [[1], [1]]]):
        assert before.try_reserve(2)
        before.put_group(make_group(group_id, versions), reserved=2)
    before.take(1, timeout_s=0.1)  # 2 trained
    before.set_trainer_version(2)  # the two version-0 groups left: one trained, one stale (2 episodes)
    before.drop_produced(1, "env_error")
    state = before.state_dict(keep_pending=False)
    assert state == {"produced": 9, "trained": 2, "dropped": {"stale": 2, "env_error": 1}, "pending": 4, "by_task": {}}

    after = RolloutBuffer(capacity=16, max_version_gap=1)
    after.load_state_dict(state)
    assert (after.produced, after.trained, after.pending) == (9, 2, 0)
    assert after.dropped == {"stale": 2, "env_error": 1, "restart": 4}  # the 4 pending were not kept
    assert after.accounting_holds()
    assert after.counts()["dropped_restart"] == 4 and after.counts()["dropped_env_error"] == 1


def test_a_mixtures_episodes_are_counted_per_task_as_produced_trained_and_dropped_stale():
    buffer = RolloutBuffer(capacity=16, max_version_gap=1)
    groups = [make_group(0, [[0], [0]]), make_group(1, [[1], [1]]), make_group(2, [[0, 2], [2]])]
    for group, task in zip(groups, ["desk", "guess", "desk"]):
        for trajectory in group:
            trajectory.task = task
        buffer.try_reserve(2)
        buffer.put_group(group, reserved=2)
    buffer.set_trainer_version(2)  # groups 0 and 2 hold a version-0 token: gap 2 > 1, both desk groups stale
    buffer.take(1, timeout_s=0.1)
    counts = buffer.counts()
    assert {key: value for key, value in counts.items() if "/" in key} == {
        "desk/produced": 4, "desk/dropped_stale": 4, "guess/produced": 2, "guess/trained": 2,
    }  # fmt: skip
    # A checkpoint carries them over.
    resumed = RolloutBuffer(capacity=16, max_version_gap=1)
    resumed.load_state_dict(buffer.state_dict(keep_pending=False))
    assert resumed.by_task == buffer.by_task
    # A single task's episodes (task None) add no per-task counts.
    single = RolloutBuffer(capacity=4, max_version_gap=1)
    single.try_reserve(1)
    single.put_group(make_group(0, [[0]]), reserved=1)
    assert not any("/" in key for key in single.counts())


def test_pending_groups_kept_by_a_checkpoint_are_trained_after_the_resume(tmp_path):
    import collections
    import math

    import torch

    before = RolloutBuffer(capacity=16, max_version_gap=2)
    for group_id, versions in enumerate([[[0], [0]], [[1, 2], [2]], [[2], [2, 2]]]):
        before.try_reserve(2)
        before.put_group(make_group(group_id, versions), reserved=2)
    before.take(1, timeout_s=0.1)  # group 0 trained; groups 1 and 2 pending
    kept = before.pending_trajectories()[0]  # group 1's first episode: scored at its v1 token, not yet at v2
    kept.old_logprobs[1], kept.old_versions[1] = -0.25, 1
    kept.advantage, kept.reward, kept.task = 0.7, 1.0, "desk"
    kept.tool_calls["lookup"] += 2
    # Through a file as Lightning writes and reads checkpoints, read back with weights_only=True.
    torch.save({"rollout": before.state_dict(keep_pending=True)}, tmp_path / "last.ckpt")
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)["rollout"]

    after = RolloutBuffer(capacity=16, max_version_gap=2)
    restored = after.load_state_dict(state)
    assert [[t.group_id for t in group] for group in restored] == [[1, 1], [2, 2]]
    assert (after.produced, after.trained, after.pending, after.num_dropped) == (
        6,
        2,
        4,
        0,
    )  # nothing dropped as "restart"
    assert after.accounting_holds() and (after.counts()["restored"], after.counts()["restored_trained"]) == (4, 0)
    episode = restored[0][0]
    assert (
        episode.token_ids == [1, 5, 5] and episode.loss_mask == [False, True, True] and episode.versions == [-1, 1, 2]
    )
    assert episode.behavior_logprobs == [0.0, -0.5, -0.5]
    assert (
        episode.old_logprobs[1] == -0.25 and episode.old_versions == [-1, 1, -1] and math.isnan(episode.old_logprobs[2])
    )
    assert (episode.advantage, episode.reward, episode.task) == (0.7, 1.0, "desk")
    assert episode.tool_calls == collections.Counter(lookup=2)
    # The trainer at version 3: group 1's v1 token is 2 behind (kept); taken in their order.
    after.set_trainer_version(3)
    first, second = after.take(2, timeout_s=0.1)
    assert (first[0].group_id, second[0].group_id) == (1, 2) and after.accounting_holds()
    assert after.counts()["restored_trained"] == 4


def test_a_checkpoint_drops_a_group_filed_too_stale_after_the_last_publish():
    buffer = RolloutBuffer(capacity=8, max_version_gap=3)
    buffer.set_trainer_version(6)  # the weight publish of step 6
    for group_id, versions in enumerate(
        [[[2, 4], [4]], [[3], [4, 5]]]
    ):  # filed after it: oldest v2 (gap 4), v3 (gap 3)
        buffer.try_reserve(2)
        buffer.put_group(make_group(group_id, versions), reserved=2)
    state = buffer.state_dict(keep_pending=True)
    assert [[episode["group_id"] for episode in group] for group in state["pending_groups"]] == [[1, 1]]
    assert (state["produced"], state["trained"], state["dropped"], state["pending"]) == (4, 0, {"stale": 2}, 2)
    resumed = RolloutBuffer(capacity=8, max_version_gap=3)
    resumed.load_state_dict(state)
    resumed.set_trainer_version(6)  # the resumed run starts at the checkpoint's version: nothing more to drop
    assert (resumed.pending, resumed.dropped["stale"], resumed.counts()["restored"]) == (2, 2, 2)


def test_a_checkpoint_without_its_pending_groups_counts_them_as_dropped_at_the_restart():
    before = RolloutBuffer(capacity=8, max_version_gap=2)
    before.try_reserve(2)
    before.put_group(make_group(0, [[0], [0]]), reserved=2)
    after = RolloutBuffer(capacity=8, max_version_gap=2)
    assert after.load_state_dict(before.state_dict(keep_pending=False)) == []
    assert (after.pending, after.dropped["restart"]) == (0, 2) and after.accounting_holds()
    assert "restored" not in after.counts()  # logged only after a resume that put episodes back
