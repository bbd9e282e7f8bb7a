"""Exported folders on the real engine: vLLM loads a full export and a LoRA export (through its LoRA
support) and its log-probs on a fixed sequence equal the restored module's; an exported folder is a
`model.path` a further run trains from and `stage=validate` evaluates. SmolLM2 (read from its GGUF
file) exports as the tiny policy does."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.export.main import main as export_main
from lit_asyncrl.models.lora import LoRASettings
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
from lit_asyncrl.scoring import token_logprobs
from tests.support.fitted_checkpoints import fitted_checkpoint
from tests.support.runs import SMALL_KV_CACHE_GIB, SMALL_RUN, read_all_rows, run_hydra

pytestmark = pytest.mark.engine

#: A fixed sequence of the tiny policy's vocabulary (and SmolLM2's), scored token by token.
IDS = [1, 17, 42, 5, 9, 23, 11, 30, 8, 14]


def trainer_logprobs(checkpoint) -> torch.Tensor:
    """What the module restored from `checkpoint` gives each token after its prefix (fp32)."""
    policy = AsyncRLModule.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=False).policy.eval()
    ids = torch.tensor([IDS])
    with torch.no_grad():
        return token_logprobs(policy, ids, torch.ones_like(ids), 1.0)[0, 1:]


def engine_logprobs(engine: VLLMEngine, lora_request=None) -> torch.Tensor:
    """The engine's own log-prob of each token of IDS after its prefix (vLLM's prompt log-probs)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)

    async def score():
        final = None
        async for output in engine._llm.generate(
            {"prompt_token_ids": IDS}, params, "export-check", lora_request=lora_request
        ):
            final = output
        return [entry[token].logprob for entry, token in zip(final.prompt_logprobs[1:], IDS[1:])]

    return torch.tensor(engine.run(score(), timeout_s=120))


def started(model_folder, lora: LoRASettings = LoRASettings()) -> VLLMEngine:
    engine = VLLMEngine(
        model_folder, EngineSettings(dtype="float32", max_model_len=256, kv_cache_gib=SMALL_KV_CACHE_GIB, lora=lora)
    )
    engine.start()
    return engine


def test_vllm_serves_a_full_export_and_a_lora_export_as_the_module_computes(tmp_path):
    from vllm.lora.request import LoRARequest

    full = fitted_checkpoint(tmp_path / "full")
    lora = fitted_checkpoint(tmp_path / "lora", lora=LoRASettings(rank=4))
    export_main([str(full), "--out", str(tmp_path / "full_export")])
    export_main([str(lora), "--out", str(tmp_path / "lora_export")])
    engine = started(tmp_path / "full_export")
    try:
        served = engine_logprobs(engine)
    finally:
        engine.shutdown()
    assert torch.allclose(served, trainer_logprobs(full), atol=1e-4, rtol=0)
    # The adapter, loaded by vLLM from the exported folder onto the base it names.
    base = json.loads((tmp_path / "lora_export" / "adapter_config.json").read_text())["base_model_name_or_path"]
    engine = started(base, lora=LoRASettings(rank=4))
    try:
        request = LoRARequest(lora_name="exported", lora_int_id=1, lora_path=str(tmp_path / "lora_export"))
        adapted, plain = engine_logprobs(engine, request), engine_logprobs(engine)
    finally:
        engine.shutdown()
    expected = trainer_logprobs(lora)
    assert torch.allclose(adapted, expected, atol=1e-4, rtol=0)
    assert (plain - expected).abs().max() > 1e-3  # the adapter is what makes the difference

    # SmolLM2, built from its GGUF file: its last layer trained, exported, loaded by transformers.
    smollm2 = fitted_checkpoint(tmp_path / "smollm2", model_path="smollm2_135m", train_last_layers=1)
    export_main([str(smollm2), "--out", str(tmp_path / "smollm2_export")])
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "smollm2_export", dtype=torch.float32).eval()
    ids = torch.tensor([IDS])
    with torch.no_grad():
        loaded = token_logprobs(exported, ids, torch.ones_like(ids), 1.0)[0, 1:]
    assert torch.allclose(loaded, trainer_logprobs(smollm2), atol=1e-6, rtol=0)
    assert "<|im_start|>" in (tmp_path / "smollm2_export" / "chat_template.jinja").read_text()


def test_an_exported_folder_trains_further_and_is_evaluated_alone(tmp_path):
    folder = tmp_path / "exported"
    export_main([str(fitted_checkpoint(tmp_path / "fit")), "--out", str(folder)])
    # One multirun process for both stages (a job costs its engine, not a process start).
    sweep = tmp_path / "sweep"
    run_hydra(
        [
            "-m",
            "stage=fit,validate",
            "model=hf",
            f"model.path={folder}",
            *SMALL_RUN,
            "model.warm_start_steps=0",
            "trainer.max_steps=2",
            f"hydra.sweep.dir={sweep}",
            "hydra.sweep.subdir=${stage}",
        ]
    )
    trained = read_all_rows(sweep / "fit" / "metrics.csv")
    assert [row["step"] for row in trained if "train/task_success" in row] == [0, 1]
    (validated,) = [row for row in read_all_rows(sweep / "validate" / "metrics.csv") if "val/avg@4" in row]
    assert 0.0 <= validated["val/avg@4"] <= validated["val/pass@4"] <= 1.0
