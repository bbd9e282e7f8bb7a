"""The built-in tiny mixture-of-experts policy (`model=tiny_moe`): its folder, its shapes and its routing."""

from __future__ import annotations

import json

import pytest
import torch

from lit_asyncrl.model_path import check_model_path
from lit_asyncrl.models import TinyMoEConfig, build_tiny_moe


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    return build_tiny_moe(cache_dir=tmp_path_factory.mktemp("cache"))


def test_the_folder_is_a_qwen3_moe_with_every_layer_routed_top_2_of_8(moe_folder):
    config = json.loads((moe_folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert (config["num_local_experts"], config["num_experts_per_tok"], config["moe_intermediate_size"]) == (8, 2, 64)
    assert (config["decoder_sparse_step"], config["mlp_only_layers"], config["norm_topk_prob"]) == (1, [], True)
    assert config["output_router_logits"] is False and config["dtype"] == "float32"
    assert (moe_folder / "tokenizer.json").is_file()


def test_it_has_the_parameter_count_of_its_shapes(moe_folder):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_folder)
    # Per layer: q 128x128 + k 64x128 + v 64x128 + o 128x128 = 49,152; q/k norms 2 x 64; experts' gate
    # and up 8 x 128 x 128 = 131,072 and down 8 x 128 x 64 = 65,536; the router 8 x 128 = 1,024; two
    # layer norms 2 x 128: 247,168. Two layers, the embedding 100 x 128 (tied to the head) and the
    # final norm 128: 494,336 + 12,800 + 128 = 507,264.
    assert sum(parameter.numel() for parameter in model.parameters()) == 507_264


def test_the_folder_is_keyed_by_the_config_and_built_once(moe_folder, tmp_path):
    again = build_tiny_moe(cache_dir=moe_folder.parent)
    assert again == moe_folder
    other = build_tiny_moe(TinyMoEConfig(num_experts=4), cache_dir=moe_folder.parent)
    assert other != moe_folder and json.loads((other / "config.json").read_text())["num_local_experts"] == 4


def test_each_token_is_computed_by_its_two_highest_scoring_experts(moe_folder):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(moe_folder)
    block = model.model.layers[0].mlp
    torch.manual_seed(1)
    hidden = torch.randn(1, 5, 128)
    with torch.no_grad():
        output = block(hidden)
        output = output[0] if isinstance(output, tuple) else output
        # By hand: softmax over the router's 8 logits, the 2 largest renormalised to sum to 1, and
        # each chosen expert's SwiGLU (down(silu(gate x) * up x)) weighted by its share.
        probabilities = torch.softmax(hidden[0] @ block.gate.weight.T, dim=-1)
        weights, chosen = probabilities.topk(2, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        expected = torch.zeros(5, 128)
        for token in range(5):
            for weight, expert in zip(weights[token], chosen[token]):
                gate, up = (block.experts.gate_up_proj[expert] @ hidden[0, token]).chunk(2)
                expected[token] += weight * (block.experts.down_proj[expert] @ (torch.nn.functional.silu(gate) * up))
    assert torch.allclose(output[0], expected, atol=1e-6)


def test_model_tiny_moe_selects_it_and_a_wrong_path_names_it_among_the_choices(tmp_path):
    from tests.support.configs import compose_train

    assert compose_train(["model=tiny_moe", f"hydra.run.dir={tmp_path}"]).model.path == "tiny_moe"
    check_model_path("tiny_moe")  # a built-in name: no folder is looked for
    with pytest.raises(ValueError, match="to tiny_moe for the built-in mixture-of-experts policy"):
        check_model_path(str(tmp_path / "no_model_here"))


def test_a_version_reaches_the_engine_as_the_checkpoint_holds_the_experts(moe_folder):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from lit_asyncrl.models.lora import LoRASettings, add_adapter, engine_weights

    on_disk = load_file(str(moe_folder / "model.safetensors"))
    policy = AutoModelForCausalLM.from_pretrained(moe_folder)
    pushed = engine_weights(policy, LoRASettings())
    # One tensor per expert, as the folder (and vLLM's loader) has them; the tied head beside the
    # embedding, which the push names once (`tied_once`).
    assert set(pushed) == set(on_disk) | {"lm_head.weight"}
    assert all(torch.equal(pushed[name], tensor) for name, tensor in on_disk.items())
    fused = policy.model.layers[1].mlp.experts.gate_up_proj
    assert torch.equal(pushed["model.layers.1.mlp.experts.5.up_proj.weight"], fused[5, 64:])
    # With LoRA pushed merged: the attention's merged weights, the experts as on disk.
    adapted = add_adapter(policy, LoRASettings(rank=8, target_modules=("q_proj", "v_proj"), push="merged"))
    merged = engine_weights(adapted, LoRASettings(rank=8, target_modules=("q_proj", "v_proj"), push="merged"))
    assert set(merged) == set(pushed)
    assert torch.equal(
        merged["model.layers.0.mlp.experts.2.down_proj.weight"],
        on_disk["model.layers.0.mlp.experts.2.down_proj.weight"],
    )


def test_a_dense_policy_is_pushed_as_it_holds_its_tensors():
    from transformers import AutoModelForCausalLM

    from lit_asyncrl.models import resolve_model_path
    from lit_asyncrl.models.lora import LoRASettings, engine_weights

    policy = AutoModelForCausalLM.from_pretrained(resolve_model_path(None))
    state = policy.state_dict()
    pushed = engine_weights(policy, LoRASettings())
    assert sorted(pushed) == sorted(state)
    assert all(pushed[name].data_ptr() == tensor.data_ptr() for name, tensor in state.items())


@pytest.mark.parametrize("moe", [True, False], ids=["moe", "dense"])
def test_a_model_takes_a_version_back_from_the_checkpoints_names(moe, moe_folder):
    from transformers import AutoModelForCausalLM

    from lit_asyncrl.models import resolve_model_path
    from lit_asyncrl.models.checkpoint_names import CheckpointLayout
    from lit_asyncrl.models.lora import LoRASettings, engine_weights

    folder = moe_folder if moe else resolve_model_path(None)
    worker, trainer = (AutoModelForCausalLM.from_pretrained(folder) for _ in range(2))
    torch.manual_seed(2)
    with torch.no_grad():
        for parameter in trainer.parameters():
            parameter.add_(torch.randn_like(parameter))
    layout = CheckpointLayout(worker)
    assert bool(layout.places) == moe  # only the experts are laid out otherwise on disk
    layout.load(worker, engine_weights(trainer, LoRASettings()))
    expected = trainer.state_dict()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in worker.state_dict().items())
    with pytest.raises(ValueError, match="do not fit the model: missing"):
        layout.load(worker, {"lm_head.weight": expected["lm_head.weight"]})
