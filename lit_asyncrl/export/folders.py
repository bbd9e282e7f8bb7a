"""The policy written as a folder others load: a Hugging Face model folder (config, safetensors,
tokenizer with its chat template, generation config), a peft adapter folder, or the adapter merged
into its base."""

from __future__ import annotations

import contextlib
import io
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

#: Where a LoRA export puts the base model it copies (the built-in ones live in this library's cache).
BASE_FOLDER = "base"


def write_model(model: Any, tokenizer: Any, out: Path) -> None:
    """`model` and `tokenizer` as a Hugging Face folder at `out` (safetensors, fp32 as trained)."""
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stderr(io.StringIO()):  # transformers' "Writing model shards" bar
        model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def with_weights(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """`model` with the tensors of `weights` (by its parameter names) copied in; refuses a name it lacks."""
    parameters = dict(model.named_parameters())
    unknown = sorted(set(weights) - set(parameters))
    if unknown:
        raise ValueError(f"the average names tensors the policy does not have: {', '.join(unknown[:5])}")
    with torch.no_grad():
        for name, tensor in weights.items():
            parameters[name].copy_(tensor)
    return model


def write_adapter(policy: Any, tokenizer: Any, base_model: str, out: Path) -> None:
    """A peft adapter folder at `out` whose `base_model_name_or_path` is `base_model`, with the tokenizer
    beside it (vLLM and peft read the adapter's; a chat template comes with it)."""
    policy.peft_config[policy.active_adapter].base_model_name_or_path = base_model
    out.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def copy_base(model_folder: Path, out: Path) -> Path:
    """The base model folder copied to `out/base` (a built-in model lives in this library's cache)."""
    target = out / BASE_FOLDER
    shutil.copytree(model_folder, target, dirs_exist_ok=True)
    return target
