"""A push of a full fine-tune's changed elements (`rollout.push_changed_elements`): what travels, and
the engine's copy rebuilt from it."""

import pytest
import torch

from lit_asyncrl.rollout.weights.changed_elements import INDEX, VALUES, ChangedElements, decode


def test_the_first_push_is_whole_then_only_the_changed_elements_travel_and_rebuild_the_tensor():
    record = ChangedElements()
    weight = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    norm = torch.ones(4, dtype=torch.bfloat16)
    first = record.encode({"w": weight, "norm": norm})
    assert sorted(first) == ["norm", "w"] and torch.equal(first["w"], weight)  # the engine holds nothing yet
    engine = decode({name: tensor.clone() for name, tensor in first.items()}, {})  # as read from the file

    weight[0, 1], weight[2, 3] = 100.0, -7.0  # two elements change, in place as under an optimizer
    second = record.encode({"w": weight, "norm": norm})
    # 2 changed of 12: 2 x (4-byte index + 2-byte value) = 12 bytes against 24 whole.
    assert sorted(second) == ["norm" + INDEX, "norm" + VALUES, "w" + INDEX, "w" + VALUES]
    assert second["w" + INDEX].tolist() == [1, 11] and second["w" + INDEX].dtype == torch.int32
    assert second["w" + VALUES].tolist() == [100.0, -7.0]
    assert second["norm" + INDEX].numel() == 0  # unchanged: nothing but an empty entry
    rebuilt = decode(second, engine)
    assert torch.equal(rebuilt["w"], weight) and torch.equal(rebuilt["norm"], norm)
    assert engine["w"][0, 1] == 1.0  # the engine's held copy is not written in place


def test_a_tensor_mostly_changed_travels_whole_and_a_change_below_the_engines_precision_not_at_all():
    record = ChangedElements()
    weight = torch.zeros(8, dtype=torch.float32)
    record.encode({"w": weight})
    weight[:5] = 1.0  # 5 of 8: 5 x 8 bytes > 32 bytes whole
    assert sorted(record.encode({"w": weight})) == ["w"]
    bf16 = torch.ones(4, dtype=torch.bfloat16)
    record.encode({"b": bf16})
    nudged = (torch.ones(4) + 1e-4).to(torch.bfloat16)  # below bf16's step at 1.0 (2^-7): the same bits
    assert record.encode({"b": nudged})["b" + INDEX].numel() == 0


def test_signed_zero_and_nan_count_as_changed():
    record = ChangedElements()
    record.encode({"w": torch.zeros(8)})
    entries = record.encode({"w": torch.tensor([-0.0, 0.0, float("nan"), 0.0, 0.0, 0.0, 0.0, 0.0])})
    assert entries["w" + INDEX].tolist() == [0, 2]


def test_changed_elements_of_a_tensor_the_engine_lacks_are_refused_by_name():
    entries = {"w" + INDEX: torch.tensor([0], dtype=torch.int32), "w" + VALUES: torch.tensor([1.0])}
    with pytest.raises(ValueError, match="changed elements of 'w' arrived, but the engine holds no earlier 'w'"):
        decode(entries, {})
