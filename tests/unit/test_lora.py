"""LoRA on the trainer's side: the adapter's parameters are all the optimizer sees, the engine gets
the adapter's tensors (sizes worked out by hand) or merged weights that reproduce the adapted policy,
and bad settings are refused naming their keys."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.before_fit import check_lora_supported
from lit_asyncrl.fsdp import FSDP2Strategy
from lit_asyncrl.models.lora import LoRASettings, adapter_weights, engine_weights, merged_weights
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.reference.attached import DedicatedReference, InterruptSyncReference
from lit_asyncrl.reference.snapshot import SnapshotReference
from tests.support.lora import adapted

#: The tiny policy's projections (hidden 128, 2 heads and 1 KV head of 64, MLP 256) as (in, out).
TINY_PROJECTIONS = {
    "q_proj": (128, 128),
    "k_proj": (128, 64),
    "v_proj": (128, 64),
    "o_proj": (128, 128),
    "gate_proj": (128, 256),
    "up_proj": (128, 256),
    "down_proj": (256, 128),
}
TINY_LAYERS = 2


def test_the_optimizer_sees_only_the_adapter(model_path):
    module = AsyncRLModule(model_path=model_path, lora=LoRASettings(rank=8))
    optimized = [p for group in module.configure_optimizers().param_groups for p in group["params"]]
    # r * (in + out) per adapted projection, per layer.
    assert (
        sum(p.numel() for p in optimized)
        == TINY_LAYERS * sum(8 * (i + o) for i, o in TINY_PROJECTIONS.values())
        == 32_768
    )
    adapter_ids = {id(p) for name, p in module.policy.named_parameters() if ".lora_A." in name or ".lora_B." in name}
    assert {id(p) for p in optimized} == adapter_ids


def test_the_adapter_sent_to_the_engine_is_its_factors_in_pefts_names(model_path):
    tensors = adapter_weights(adapted(model_path, rank=4))
    assert len(tensors) == TINY_LAYERS * len(TINY_PROJECTIONS) * 2
    a = tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"]
    assert (tuple(a.shape), tuple(b.shape)) == ((4, 128), (64, 4))
    assert tuple(tensors["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"].shape) == (4, 256)
    assert 4 * sum(t.numel() for t in tensors.values()) == 4 * TINY_LAYERS * sum(
        4 * (i + o) for i, o in TINY_PROJECTIONS.values()
    )


def test_merged_weights_reproduce_the_adapted_policy_under_the_models_own_names(model_path):
    policy = adapted(model_path)
    merged = merged_weights(policy)
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    input_ids = torch.randint(3, 60, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, got = policy(input_ids=input_ids).logits, plain(input_ids=input_ids).logits
        base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)(input_ids=input_ids).logits
    assert (expected - base).abs().max() > 1e-2  # the adapter changes the policy
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    # Computed beside the base weights: the wrapped layers are left exactly as they were.
    weight = policy.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert torch.equal(
        weight,
        AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).model.layers[0].self_attn.q_proj.weight,
    )


def test_engine_weights_follow_the_push_setting(model_path):
    policy = adapted(model_path)
    assert set(engine_weights(policy, LoRASettings(rank=8))) == set(adapter_weights(policy))
    assert set(engine_weights(policy, LoRASettings(rank=8, push="merged"))) == set(merged_weights(policy))
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    assert set(engine_weights(plain, LoRASettings())) == set(plain.state_dict())


def test_the_engine_rank_is_the_smallest_vllm_takes():
    assert [LoRASettings(rank=r).engine_max_rank() for r in (1, 2, 8, 9, 64, 100)] == [1, 8, 8, 16, 64, 128]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rank": -1}, "model.lora.rank must be an integer >= 0"),
        ({"rank": 1.5}, "model.lora.rank must be an integer >= 0"),
        ({"rank": 1024}, "model.lora.rank=1024: vLLM serves adapters up to rank 512"),
        ({"rank": 8, "alpha": 0}, "model.lora.alpha must be > 0"),
        ({"rank": 8, "dropout": 1.0}, r"model.lora.dropout must be in \[0, 1\)"),
        ({"rank": 8, "push": "delta"}, "model.lora.push='delta': choose one of adapter, merged"),
        ({"rank": 8, "target_modules": []}, "model.lora.target_modules is empty"),
    ],
)
def test_bad_settings_are_refused_by_key(settings, message):
    with pytest.raises(ValueError, match=message):
        LoRASettings(**settings)


def test_a_target_the_model_lacks_is_refused_by_name(model_path):
    with pytest.raises(ValueError, match="model.lora.target_modules: Qwen3ForCausalLM has no layer named c_attn"):
        AsyncRLModule(model_path=model_path, lora=LoRASettings(rank=8, target_modules=("q_proj", "c_attn")))


def test_an_adapter_and_last_layers_are_refused_together(model_path):
    with pytest.raises(ValueError, match="set one of them"):
        AsyncRLModule(model_path=model_path, lora=LoRASettings(rank=8), train_last_layers=1)


def test_combinations_the_engines_cannot_serve_are_refused():
    adapter, merged = LoRASettings(rank=8), LoRASettings(rank=8, push="merged")
    with pytest.raises(ValueError, match=r"model.lora .* and rollout.lora .* differ"):
        check_lora_supported(adapter, LoRASettings(), SnapshotReference(), strategy=None)
    for reference, name in ((InterruptSyncReference(), "interrupt_sync"), (DedicatedReference(), "dedicated")):
        with pytest.raises(
            ValueError, match=f"reference={name} with model.lora.push=adapter needs model.lora.in_flight=move"
        ):
            check_lora_supported(adapter, adapter, reference, strategy=None)
        moving = LoRASettings(rank=8, in_flight="move")
        check_lora_supported(moving, moving, reference, strategy=None)  # turns in flight move at a push
        check_lora_supported(merged, merged, reference, strategy=None)  # full weights: as without LoRA
    check_lora_supported(adapter, adapter, SnapshotReference(), strategy=None)
    with pytest.raises(
        ValueError, match="model.lora.rank=8 under trainer.strategy=fsdp2: not supported yet; use trainer.strategy=ddp"
    ):
        check_lora_supported(adapter, adapter, SnapshotReference(), strategy=FSDP2Strategy())
    check_lora_supported(LoRASettings(), LoRASettings(), SnapshotReference(), strategy=FSDP2Strategy())  # no adapter


def test_a_checkpoint_holds_what_trains_and_a_resume_takes_the_rest_from_the_model_folder(model_path):
    module = AsyncRLModule(model_path=model_path, lora=LoRASettings(rank=8))
    with torch.no_grad():
        for name, parameter in module.policy.named_parameters():
            if ".lora_B." in name:
                parameter.normal_(0, 0.1)  # as after some steps
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    assert len(checkpoint["state_dict"]) == 28 and all(
        ".lora_" in name for name in checkpoint["state_dict"]
    )  # no base weight
    resumed = AsyncRLModule(model_path=model_path, lora=LoRASettings(rank=8))
    resumed.on_load_checkpoint(checkpoint)
    resumed.load_state_dict(checkpoint["state_dict"])  # strict: the frozen weights are back
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
    other = {**checkpoint, "frozen_parameters_from": "/elsewhere/model"}
    with pytest.raises(ValueError, match="left out the frozen parameters of /elsewhere/model"):
        resumed.on_load_checkpoint(other)
