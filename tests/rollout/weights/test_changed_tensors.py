"""Which tensors a push sends to an engine that already holds the previous version."""

import weakref

import torch
from torch import nn

from lit_asyncrl.rollout.weights.changed_tensors import ChangedTensors


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


def test_a_changed_projection_travels_with_those_vllm_fuses_it_with():
    # q, k and v become one qkv_proj in vLLM, gate and up one gate_up_proj: a reload of a part
    # leaves the rest uninitialised. A merged LoRA adapter on q_proj and v_proj changes two of three.
    parts = (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
    names = [f"model.layers.{i}.{part}.weight" for i in (0, 1) for part in parts]
    state = {
        name: torch.zeros(2)
        for name in [*names, "model.layers.0.self_attn.q_norm.weight", "model.norm.weight", "model.embed_tokens.weight"]
    }
    changed = ChangedTensors()
    changed.sent(state)
    merged = {
        **state,
        "model.layers.0.self_attn.q_proj.weight": torch.ones(2),
        "model.layers.0.self_attn.v_proj.weight": torch.ones(2),
    }
    assert sorted(changed.select(merged)) == [
        f"model.layers.0.self_attn.{part}.weight" for part in ("k_proj", "q_proj", "v_proj")
    ]
    # up alone pulls gate; a trained final norm travels alone (not with the embedding beside it)
    written = {**state, "model.layers.1.mlp.up_proj.weight": torch.ones(2), "model.norm.weight": torch.ones(2)}
    assert sorted(changed.select(written)) == [
        "model.layers.1.mlp.gate_proj.weight",
        "model.layers.1.mlp.up_proj.weight",
        "model.norm.weight",
    ]


def test_a_changed_expert_travels_with_every_expert_of_its_layer():
    experts = [
        f"model.layers.{layer}.mlp.experts.{expert}.{part}.weight"
        for layer in (0, 1)
        for expert in (0, 1)
        for part in ("gate_proj", "up_proj", "down_proj")
    ]
    state = {name: torch.zeros(2) for name in [*experts, "model.layers.0.mlp.gate.weight"]}
    changed = ChangedTensors()
    changed.sent(state)
    written = {**state, "model.layers.1.mlp.experts.0.up_proj.weight": torch.ones(2)}
    assert sorted(changed.select(written)) == sorted(name for name in experts if name.startswith("model.layers.1."))


def test_the_pushed_tensors_are_held_so_that_a_new_one_cannot_take_their_address():
    # The allocator may give a freed block to the next tensor made: a merged weight made for the next
    # push could land where the previous one was, with the same fresh write counter, and pass for
    # unchanged (seen on the real engine). Holding the pushed tensors until the next push prevents it.
    changed, pushed = ChangedTensors(), torch.zeros(1024)
    held = weakref.ref(pushed)
    changed.sent({"w": pushed})
    del pushed
    assert held() is not None
    assert set(changed.select({"w": torch.zeros(1024)})) == {"w"}
    changed.sent({"w": torch.ones(1024)})
    assert held() is None  # released at the next push
