"""Which tensors a push sends to an engine that already holds the previous version."""

import torch
from torch import nn

from lit_asyncrl.rollout.changed_tensors import ChangedTensors


def frozen_first_layer() -> nn.Sequential:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
    model[0].requires_grad_(False)
    return model


def test_the_first_push_sends_everything_then_only_what_the_optimizer_wrote():
    model, changed = frozen_first_layer(), ChangedTensors()
    state = model.state_dict()
    assert set(changed.select(state)) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    changed.sent(state)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    state = model.state_dict()
    assert set(changed.select(state)) == {"1.weight", "1.bias"}
    changed.sent(state)
    assert changed.select(model.state_dict()) == {}  # nothing written since


def test_a_tensor_made_anew_or_written_in_place_counts_as_changed():
    model, changed = frozen_first_layer(), ChangedTensors()
    changed.sent(model.state_dict())
    state = {**model.state_dict(), "0.weight": model[0].weight.detach() + 0.0}  # e.g. a merged LoRA weight
    assert set(changed.select(state)) == {"0.weight"}
    with torch.no_grad():
        model[0].bias.zero_()  # a frozen tensor written after all: sent again
    assert set(changed.select(model.state_dict())) == {"0.bias"}


def test_a_sharded_tensor_is_always_sent():
    class Sharded(torch.Tensor):
        def to_local(self):
            return self

    changed = ChangedTensors()
    state = {"w": torch.zeros(2).as_subclass(Sharded)}
    changed.sent(state)
    assert set(changed.select(state)) == {"w"}
