"""SnapshotStore (host copies, staleness drop, release, budget) and version shards."""

import gc
import weakref

import pytest
import torch
from asyncrl_callbacks.snapshot_store import SnapshotBudgetError, SnapshotStore, module_tensors
from asyncrl_callbacks.version_shards import version_shards
from torch import nn

FP32_BYTES = (4 * 3 + 3) * 4  # Linear(4, 3): weight 12 + bias 3 floats


def linear() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(4, 3)


# ------------------------------------------------------------------------------- version shards


def test_one_shard_per_distinct_masked_version_with_its_rows():
    versions = torch.tensor([[0, 1, 1], [1, 2, 2], [2, 2, 2]])
    mask = torch.ones(3, 3, dtype=torch.bool)
    shards = version_shards(versions, mask)
    assert [s.version for s in shards] == [0, 1, 2]
    assert [s.rows.tolist() for s in shards] == [[0], [0, 1], [1, 2]]
    # token_mask marks, inside the shard's rows, the positions of that version only.
    assert shards[1].token_mask.tolist() == [[False, True, True], [True, False, False]]


def test_unmasked_positions_create_no_shard():
    versions = torch.tensor([[7, 0, 0], [7, 1, 1]])  # 7: prompt tokens carry no sampled version
    mask = torch.tensor([[False, True, True], [False, True, False]])
    shards = version_shards(versions, mask)
    assert [s.version for s in shards] == [0, 1]
    assert shards[1].token_mask.tolist() == [[False, True, False]]
    assert version_shards(versions, torch.zeros_like(mask)) == []


def test_shards_reject_mismatched_shapes():
    with pytest.raises(ValueError, match="same"):
        version_shards(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 2, dtype=torch.bool))


# ------------------------------------------------------------------------------- saving


def test_save_copies_parameters_and_buffers_to_host():
    module = nn.BatchNorm1d(3)  # has parameters and buffers (running stats, an int64 counter)
    store = SnapshotStore(max_staleness=1)
    store.save(module, 0)
    snapshot = store.get(0)
    assert snapshot.keys() == module_tensors(module).keys()
    with torch.no_grad():
        module.weight.add_(1.0)
    assert torch.equal(snapshot["weight"], torch.ones(3))  # a copy, not a view of the live tensor
    assert snapshot["num_batches_tracked"].dtype == torch.long


def test_tied_parameters_are_stored_once():
    model = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight
    store = SnapshotStore(max_staleness=0)
    assert store.save(model, 0) == 5 * 3 * 4
    assert list(store.get(0)) == ["0.weight"]


def test_bf16_storage_halves_parameter_bytes_and_keeps_buffers():
    store = SnapshotStore(max_staleness=0, storage_dtype=torch.bfloat16)
    assert store.save(linear(), 0) == FP32_BYTES // 2
    assert store.get(0)["weight"].dtype == torch.bfloat16
    bn = nn.BatchNorm1d(4)  # params 2*4 floats -> bf16; running stats 2*4 floats stay fp32; counter int64
    assert store.snapshot_nbytes(bn) == 8 * 2 + 8 * 4 + 8


def test_storage_dtype_may_be_named_as_in_a_config():
    assert SnapshotStore(max_staleness=0, storage_dtype="bfloat16").storage_dtype == torch.bfloat16
    assert SnapshotStore(max_staleness=0, storage_dtype="torch.float16").storage_dtype == torch.float16


def test_pin_memory_is_not_used_for_cpu_weights():
    store = SnapshotStore(max_staleness=0, pin_memory=True)
    store.save(linear(), 0)
    assert not store.get(0)["weight"].is_pinned()


# ------------------------------------------------------------------------------- dropping


def test_saving_drops_versions_beyond_the_staleness_cap():
    store = SnapshotStore(max_staleness=2)
    for version in range(5):
        store.save(linear(), version)
    assert store.versions == (2, 3, 4)  # a token of version 1 would have gap 3 > 2 at version 4
    assert store.resident_bytes == 3 * FP32_BYTES


def test_release_unreferenced_frees_memory_and_keeps_the_newest():
    store = SnapshotStore(max_staleness=5)
    for version in range(4):
        store.save(linear(), version)
    refs = [weakref.ref(t) for t in store.get(1).values()] + [weakref.ref(t) for t in store.get(2).values()]
    assert store.release_unreferenced([0]) == [1, 2]
    gc.collect()
    assert all(ref() is None for ref in refs)  # the store held the only references
    assert store.versions == (0, 3)  # 3 is the newest: the engine samples with it
    assert store.resident_bytes == 2 * FP32_BYTES


def test_missing_version_names_it_and_the_resident_ones():
    store = SnapshotStore(max_staleness=1)
    store.save(linear(), 4)
    with pytest.raises(KeyError, match=r"version 2 \(resident: \[4\]\)"):
        store.get(2)


# ------------------------------------------------------------------------------- budget


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"max_staleness": -1}, "max_staleness"),
        ({"max_staleness": 2, "max_resident": 2}, "max_resident"),
        ({"max_staleness": 0, "max_bytes": 0}, "max_bytes"),
        ({"max_staleness": 0, "storage_dtype": torch.int8}, "storage_dtype"),
        ({"max_staleness": 0, "storage_dtype": "bf16"}, "storage_dtype"),
        ({"max_staleness": 0, "keep": "frozen"}, "keep='frozen': choose one of trainable, all"),
    ],
)
def test_invalid_arguments_are_rejected_up_front(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        SnapshotStore(**kwargs)


def test_max_resident_of_staleness_plus_one_is_enough_forever():
    store = SnapshotStore(max_staleness=2, max_resident=3)
    for version in range(10):
        store.save(linear(), version)
    assert store.versions == (7, 8, 9)


def test_max_bytes_too_small_for_the_staleness_cap_fails_at_the_first_snapshot():
    store = SnapshotStore(max_staleness=2, max_bytes=3 * FP32_BYTES - 1)
    with pytest.raises(ValueError, match=r"max_bytes=179 cannot hold max_staleness \+ 1 = 3 snapshots of 60 bytes"):
        store.save(linear(), 0)
    assert len(store) == 0
    SnapshotStore(max_staleness=2, max_bytes=3 * FP32_BYTES).save(linear(), 0)


def test_full_budget_raises_instead_of_dropping_a_needed_version():
    store = SnapshotStore(max_staleness=1, max_resident=2)
    store.put(20, module_tensors(linear()))  # e.g. restored from a checkpoint
    store.put(21, module_tensors(linear()))
    with pytest.raises(SnapshotBudgetError, match=r"max_resident=2 reached \(resident versions \[20, 21\]\)"):
        store.save(linear(), 5)
    assert store.versions == (20, 21)


def test_full_byte_budget_raises():
    store = SnapshotStore(max_staleness=0, max_bytes=FP32_BYTES)
    store.put(3, {"w": torch.zeros(10)})  # 40 bytes, newer than the one saved below
    with pytest.raises(SnapshotBudgetError, match="max_bytes=60 reached"):
        store.save(linear(), 1)
