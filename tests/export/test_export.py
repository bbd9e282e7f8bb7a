"""`lit-asyncrl export` on checkpoints of short engine-free fits of the tiny policy: the folders load
with transformers and peft and compute what the module restored from the checkpoint computes; the
EWMA export holds the average; refusals come before any work, naming what is wrong."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.cli import main as cli_main
from lit_asyncrl.export.main import main as export_main
from lit_asyncrl.models.lora import LoRASettings
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.reference.ewma import EWMAReferenceSource
from lit_asyncrl.scoring import token_logprobs
from tests.support.fitted_checkpoints import fitted_checkpoint

#: A fixed prompt of the tiny policy's vocabulary and a continuation, scored token by token.
IDS = torch.tensor([[1, 17, 42, 5, 9, 23, 11, 30, 8, 14]])


def logprobs(policy: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return token_logprobs(policy.eval(), IDS, torch.ones_like(IDS), 1.0)[0, 1:]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One fit per kind of run, shared by the tests: all weights (with a PPO-EWMA reference, whose
    average the checkpoint keeps), the last layer alone, a LoRA adapter."""
    folder = tmp_path_factory.mktemp("fits")
    return {
        "all weights": fitted_checkpoint(folder / "all", reference=EWMAReferenceSource(beta=0.5)),
        "last layer": fitted_checkpoint(folder / "last", train_last_layers=1),
        "lora": fitted_checkpoint(folder / "lora", lora=LoRASettings(rank=4)),
    }


def restored(path) -> torch.nn.Module:
    return AsyncRLModule.load_from_checkpoint(path, map_location="cpu", weights_only=False).policy


@pytest.mark.parametrize("run", ["all weights", "last layer"])
def test_a_trained_model_exports_as_a_folder_transformers_loads_with_the_same_log_probs(
    tmp_path, model_path, checkpoints, run
):
    checkpoint = checkpoints[run]
    out = tmp_path / "exported"
    assert export_main([str(checkpoint), "--out", str(out)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    expected = logprobs(restored(checkpoint))
    assert torch.allclose(logprobs(exported), expected, atol=1e-6, rtol=0)
    # It trained: the initial policy computes something else.
    initial = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    assert (logprobs(initial) - expected).abs().max() > 1e-3
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "README.md"):
        assert (out / name).is_file(), name
    card = (out / "README.md").read_text()
    assert "at optimizer step 2" in card and '"lr": 0.01' in card


def test_a_lora_run_exports_an_adapter_on_its_copied_base_and_merged_equals_it(tmp_path, checkpoints):
    checkpoint = checkpoints["lora"]
    adapter_dir, merged_dir = tmp_path / "adapter", tmp_path / "merged"
    export_main([str(checkpoint), "--out", str(adapter_dir)])
    export_main([str(checkpoint), "--out", str(merged_dir), "--merge"])
    from peft import AutoPeftModelForCausalLM

    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    # The built-in tiny policy lives in the library's cache: the base is copied beside the adapter.
    assert config["base_model_name_or_path"] == str((adapter_dir / "base").resolve())
    assert config["r"] == 4 and (adapter_dir / "adapter_model.safetensors").is_file()
    adapter = AutoPeftModelForCausalLM.from_pretrained(adapter_dir, dtype=torch.float32)
    expected = logprobs(restored(checkpoint))
    assert torch.allclose(logprobs(adapter), expected, atol=1e-6, rtol=0)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    assert not (merged_dir / "adapter_config.json").exists()
    assert torch.allclose(logprobs(merged), logprobs(adapter), atol=1e-5, rtol=0)
    # The adapter moved the policy away from its base.
    base = AutoModelForCausalLM.from_pretrained(adapter_dir / "base", dtype=torch.float32)
    assert (logprobs(base) - expected).abs().max() > 1e-3


def test_the_ewma_export_holds_the_average_not_the_live_weights(tmp_path, checkpoints):
    checkpoint = checkpoints["all weights"]
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)
    ((_, state),) = saved["ewma_reference"].items()
    out = tmp_path / "ewma"
    export_main([str(checkpoint), "--out", str(out), "--weights", "ewma"])
    exported = dict(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).named_parameters())
    live = dict(restored(checkpoint).named_parameters())
    moved = 0
    for name, average in state["average"].items():
        name = name.removeprefix("policy.")
        assert torch.equal(exported[name], average), name
        moved += not torch.equal(average, live[name])
    assert moved > 0  # after two steps at beta 0.5 the average is not the live weights
    assert "(the PPO-EWMA average)" in (out / "README.md").read_text()


def test_refusals_come_before_any_work_naming_what_is_wrong(tmp_path, checkpoints):
    not_ours = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"layer.weight": torch.zeros(2)}, "hyper_parameters": {"lr": 1.0}}, not_ours)
    with pytest.raises(ValueError, match=r"not a checkpoint of lit_asyncrl's AsyncRLModule"):
        export_main([str(not_ours), "--out", str(tmp_path / "a")])
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ValueError, match=r"not a checkpoint torch can read"):
        export_main([str(text), "--out", str(tmp_path / "a")])
    with pytest.raises(FileNotFoundError, match=r"CKPT=.*missing.ckpt: no such checkpoint file"):
        export_main([str(tmp_path / "missing.ckpt"), "--out", str(tmp_path / "a")])
    checkpoint = checkpoints["last layer"]  # no adapter, no EWMA average
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mine.txt").write_text("keep")
    with pytest.raises(SystemExit, match=r"--out .*busy: a folder that is not empty \(--force writes into it"):
        export_main([str(checkpoint), "--out", str(busy)])
    with pytest.raises(SystemExit, match=r"--merge: .* trained the model's weights, not a LoRA adapter"):
        export_main([str(checkpoint), "--out", str(tmp_path / "b"), "--merge"])
    with pytest.raises(ValueError, match=r"--weights ewma: .* holds 0 EWMA averages \(the run had no reference=ewma\)"):
        export_main([str(checkpoint), "--out", str(tmp_path / "c"), "--weights", "ewma"])
    assert not any((tmp_path / name).exists() for name in ("a", "b", "c"))
    # --force writes into the folder, over files of the same names only.
    export_main([str(checkpoint), "--out", str(busy), "--force"])
    assert (busy / "mine.txt").read_text() == "keep" and (busy / "model.safetensors").is_file()


def test_the_command_is_a_subcommand_of_lit_asyncrl_named_in_its_help(capsys):
    with pytest.raises(SystemExit) as exited:
        cli_main(["export", "--help"])
    assert exited.value.code == 0
    assert "--merge" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        cli_main(["--help"])
    assert exited.value.code == 0
    assert "export CKPT --out DIR (the trained policy as a Hugging Face folder)" in " ".join(
        capsys.readouterr().out.split()
    )
