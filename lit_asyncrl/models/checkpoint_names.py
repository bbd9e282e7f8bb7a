"""A policy's tensors under the names and layout its checkpoint has on disk: what vLLM's loaders read.

transformers (5.x) holds some weights in another layout than its checkpoints: a mixture of experts'
feed-forward is one fused tensor per layer (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`), where
the checkpoint, and so vLLM's loader, has one per expert (`mlp.experts.3.gate_proj.weight`). It converts
them back when it saves (`save_pretrained`); a weight push takes the same conversion, transformers'
`revert_weight_conversion`. A model without such conversions (the dense tiny policy, SmolLM2) keeps its
names and its tensors (the same storage: a tied embedding stays visibly tied).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


def checkpoint_named(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` of `model` as its checkpoint names and lays out the tensors (as it is for a model
    that is not a transformers model: it has no checkpoint conversions)."""
    if getattr(model, "config", None) is None:
        return dict(state_dict)
    from transformers.core_model_loading import revert_weight_conversion

    return revert_weight_conversion(model, dict(state_dict))
