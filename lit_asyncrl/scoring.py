"""Trainer-side token log-probs, computed exactly as the engine samples (same temperature, top-k)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def logits_to_token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: float, top_k: int = -1
) -> torch.Tensor:
    """Log-prob of each token under the distribution that predicted it.

    Args:
        logits: [B, T, V] logits of a causal LM over `input_ids`.
        input_ids: [B, T].
        temperature, top_k: the sampling settings of the engine (vLLM processed log-probs).

    Returns:
        [B, T]: entry t is log p(input_ids[t] | input_ids[:t]); entry 0 (no prediction) is 0.
    """
    scaled = logits[:, :-1].float() / temperature  # [B, T-1, V]
    if top_k > 0:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]  # [B, T-1, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    picked = F.log_softmax(scaled, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, T-1]
    return F.pad(picked, (1, 0))


def token_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float, top_k: int = -1
) -> torch.Tensor:
    """[B, T] token log-probs of a Hugging Face causal LM (gradient flows when enabled)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    return logits_to_token_logprobs(logits, input_ids, temperature, top_k)


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[B, T] entropy of the next-token distribution that predicted each token (entry 0 is 0)."""
    logp = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    return F.pad(-(logp.exp() * logp).sum(-1), (1, 0))
