"""The built-in tiny policy: a Qwen3-architecture causal LM made from a config, random init, seeded.

It is written once as a real Hugging Face model folder (config, safetensors, tokenizer) under a
cache directory keyed by its config, so vLLM and transformers both load it like a downloaded model.
Shapes follow vLLM's measured CPU limits: its CPU attention rejects head_dim 16, and head_dim 64 works.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch

from lit_asyncrl.cache_dir import default_cache_dir
from lit_asyncrl.models.char_tokenizer import VOCAB, build_char_tokenizer
from lit_asyncrl.models.folder import cached_model_folder


@dataclasses.dataclass(frozen=True)
class TinyPolicyConfig:
    """Architecture and seed of the built-in tiny policy (about 0.3M parameters by default)."""

    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    num_kv_heads: int = 1
    head_dim: int = 64
    intermediate_size: int = 256
    max_position_embeddings: int = 1024
    #: True: the output head is the embedding matrix (as in most small chat models).
    tie_word_embeddings: bool = True
    seed: int = 0

    def fingerprint(self) -> str:
        # The vocabulary is part of the model: a new tokenizer must never reuse a cached folder.
        blob = json.dumps({**dataclasses.asdict(self), "vocab": VOCAB}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def build_tiny_policy(config: TinyPolicyConfig = TinyPolicyConfig(), cache_dir: Path | None = None) -> Path:
    """Write the tiny policy folder if it is not there yet and return its path (idempotent)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    target = Path(cache_dir or default_cache_dir()) / f"tiny-qwen3-{config.fingerprint()}"

    def build():
        tokenizer = build_char_tokenizer()
        hf_config = Qwen3Config(intermediate_size=config.intermediate_size, **shared_architecture(config, tokenizer))
        torch.manual_seed(config.seed)
        return Qwen3ForCausalLM(hf_config), tokenizer

    return cached_model_folder(target, build)


def shared_architecture(config: TinyPolicyConfig, tokenizer) -> dict:
    """The Hugging Face config arguments the tiny policies share (dense and mixture of experts)."""
    return dict(
        vocab_size=len(VOCAB),
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
