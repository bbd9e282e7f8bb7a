"""The trained policy as loaded from a model folder, without dropout.

vLLM samples without dropout, and pi_old, pi_ref and every averaged reference are the policy itself,
not a random thinning of it: with dropout in the trainer, pi_theta / mu_old would differ from 1 even
at the engine's own weights (a GPT-2-shaped model with the usual 0.1: up to 0.20 nats per token
between two forwards at the same weights). So a model whose config turns dropout on is loaded with
it off, and a note says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info


def dropout_settings(config: Any) -> dict[str, float]:
    """The dropout probabilities above 0 in a transformers model `config`, by name
    (`attention_dropout`, `hidden_dropout_prob`, GPT-2's `resid_pdrop`, ...)."""
    return {
        name: value
        for name, value in config.to_dict().items()
        if ("dropout" in name or name.endswith("pdrop")) and isinstance(value, float) and value > 0
    }


def load_policy(model_path: str | Path) -> Any:
    """The causal LM in `model_path` in fp32 and training mode, every dropout probability set to 0."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    switched_off = dropout_settings(config)
    for name in switched_off:
        setattr(config, name, 0.0)
    if switched_off:
        settings = ", ".join(f"{name}={value}" for name, value in switched_off.items())
        # On the console beside Lightning's own notes, once however many training processes load it.
        rank_zero_info(f"{model_path}: dropout set to 0 for RL ({settings}): the engine samples without it")
    policy = AutoModelForCausalLM.from_pretrained(model_path, config=config, dtype=torch.float32)
    return policy.train()  # from_pretrained returns eval mode
