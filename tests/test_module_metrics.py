"""The module's reference-gap metric and its layer freezing, by hand."""

import math

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from lit_asyncrl.module import freeze_all_but_last_layers
from lit_asyncrl.step_metrics import reference_gap_metrics


def test_reference_gap_ignores_context_and_unscored_tokens_and_splits_by_version_gap():
    ref = torch.tensor([[0.0, -1.0, math.nan, -2.0, -3.0]])
    mu = torch.tensor([[5.0, -1.5, -1.0, -1.75, -2.0]])
    policy = torch.tensor([[False, True, True, True, True]])
    gap = torch.tensor([[0, 0, 1, 5, 4]])
    # policy tokens: |-1 + 1.5| = 0.5 (gap 0), NaN (unscored, left out), |-2 + 1.75| = 0.25 and
    # |-3 + 2| = 1.0 (gaps 5 and 4: bucket gap_4plus); nothing scored at gap 1, so no gap_1 entries.
    assert reference_gap_metrics(ref, mu, policy, gap) == {
        "train/ref_behavior_logratio_absmax": 1.0,
        "train/ref_behavior_logratio_absmean": pytest.approx(1.75 / 3, abs=1e-7),
        "train/ref_behavior_logratio_absmax/gap_0": 0.5,
        "train/ref_behavior_logratio_absmean/gap_0": 0.5,
        "train/ref_behavior_logratio_absmax/gap_4plus": 1.0,
        "train/ref_behavior_logratio_absmean/gap_4plus": 0.625,
    }


def test_no_reference_or_nothing_scored_logs_nothing():
    mu, gap = torch.zeros(1, 2), torch.zeros(1, 2, dtype=torch.long)
    assert reference_gap_metrics(None, mu, torch.ones(1, 2, dtype=torch.bool), gap) == {}
    assert reference_gap_metrics(torch.full((1, 2), math.nan), mu, torch.ones(1, 2, dtype=torch.bool), gap) == {}


def tiny_llm(layers: int = 3) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=True,
    )
    return Qwen3ForCausalLM(config)


def test_only_the_last_layers_and_the_final_norm_train():
    model = tiny_llm(layers=3)
    freeze_all_but_last_layers(model, 2)
    trainable = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    assert trainable == {
        name
        for name, _ in model.named_parameters()
        if name.startswith(("model.layers.1.", "model.layers.2.", "model.norm."))
    }
    assert not model.model.embed_tokens.weight.requires_grad  # the tied head with it
    # Frozen layers get no gradient from a backward pass.
    ids = torch.tensor([[1, 2, 3]])
    model(input_ids=ids).logits.sum().backward()
    assert model.model.layers[0].mlp.up_proj.weight.grad is None
    assert model.model.layers[2].mlp.up_proj.weight.grad is not None


@pytest.mark.parametrize("count", [0, 4])
def test_a_layer_count_out_of_range_names_the_key(count):
    with pytest.raises(ValueError, match=r"model.train_last_layers must be in 1..3"):
        freeze_all_but_last_layers(tiny_llm(layers=3), count)
