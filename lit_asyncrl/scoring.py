"""Trainer-side token log-probs, computed exactly as the engine samples (same temperature, top-k)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from asyncrl_callbacks.eval_mode import evaluation_mode, has_active_dropout


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


def policy_logits(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """The logits a training step scores, and the position they start at.

    Only positions from the one before the batch's first policy token on are kept (Hugging Face's
    `logits_to_keep`): the opening before it is never scored, and in a long-prompt task (a tool task's
    schemas and policy, thousands of tokens) its [positions, vocabulary] logits, their softmax and their
    gradients would take most of the step's memory. A model without `logits_to_keep` gives all of them.

    Returns:
        ([B, T - start, V] logits of positions start..T-1, start).
    """
    length = input_ids.shape[1]
    policy_positions = loss_mask.any(dim=0).nonzero()
    start = max(int(policy_positions[0]) - 1, 0) if len(policy_positions) else 0
    try:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=length - start).logits
    except TypeError:  # a model of one's own without the argument
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, start:]
    return logits, start


def token_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[B, T] entropy of the next-token distribution that predicted each token (entry 0 is 0)."""
    logp = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    return F.pad(-(logp.exp() * logp).sum(-1), (1, 0))


def live_logprobs_without_dropout(
    policy: torch.nn.Module, batch: dict, training_logprobs: torch.Tensor
) -> torch.Tensor:
    """[B, T] the live weights' log-probs as every reference scores them: with dropout off, detached.

    They are the training forward's `training_logprobs` unless the policy has active dropout (a LoRA
    adapter with `model.lora.dropout` above 0, a model of one's own): then the training forward drops
    activations and one more forward, in eval mode and without gradients, gives them. Interruption-sync
    takes them as pi_old of the tokens of the version being trained, the snapshot reference for its
    newest version.
    """
    if not has_active_dropout(policy):
        return training_logprobs.detach()
    with torch.no_grad(), evaluation_mode(policy):
        return token_logprobs(policy, batch["input_ids"], batch["attention_mask"], batch["temperature"], batch["top_k"])
