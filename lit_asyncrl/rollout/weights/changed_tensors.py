"""What of a state dict one engine still needs: the tensors written since its last push.

An engine starts from the model folder and is first pushed every tensor; after that, a tensor whose
storage and in-place-write counter are those it had at the engine's last push holds the values the
engine already has, and is not sent again. Frozen parameters (frozen layers, `model.train_last_layers`)
are never written, so after the first push only the trained tensors travel. The optimizer writes every
trained tensor in place, and a tensor built anew for a push (e.g. a merged LoRA weight) has new storage,
so both always count as written: the tensors of the last push are held until the next, so that a new
tensor cannot take over a freed one's address (seen: a merged weight at its predecessor's address,
taken for unchanged). A sharded tensor (FSDP2's DTensor) is always sent. The identity is the
one snapshot retention checks frozen parameters with (`asyncrl_callbacks.snapshot_store.tensor_identity`).

A changed projection travels with the projections vLLM fuses it with (`qkv_proj` = q, k, v;
`gate_up_proj` = gate, up: the `packed_modules_mapping` of vLLM's Llama-family models): a reload that
brings only some parts of a fused layer processes it with the others uninitialised
(`finalize_layerwise_processing` in vllm/model_executor/model_loader/reload/layerwise.py). A LoRA
adapter on `q_proj` and `v_proj` only, pushed merged, changes two of the three. A mixture of experts'
layer travels with all its experts (vLLM packs their gate, up and down projections into two tensors).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch
from asyncrl_callbacks.snapshot_store import tensor_identity

#: HF projection names vLLM loads as one layer (each Llama-family model's `packed_modules_mapping`).
FUSED_PROJECTIONS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class TensorSelection(Protocol):
    """Which tensors of a version travel to one engine."""

    def select(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors of `state_dict` to send."""

    def sent(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """The engine now holds every tensor of `state_dict`."""


class WholeTensors:
    """Every tensor travels at every push: a LoRA adapter is a version on its own, sent whole."""

    def select(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(state_dict)

    def sent(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        pass


class ChangedTensors:
    """Per engine: `select` what to push, `sent` once the push has arrived."""

    def __init__(self) -> None:
        self._at_last_push: dict[str, tuple[int, int] | None] | None = None  # None: nothing sent yet
        self._last_pushed: dict[str, torch.Tensor] = {}  # held: their addresses stay theirs

    def select(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The tensors of `state_dict` written since the last push `sent` recorded (all, the first
        time), with the parts of the fused layers they belong to."""
        if self._at_last_push is None:
            return dict(state_dict)
        written = {
            name
            for name, tensor in state_dict.items()
            if (identity := tensor_identity(tensor)) is None or self._at_last_push.get(name) != identity
        }
        fused = {layer for name in written if (layer := _fused_layer(name)) is not None}
        return {name: tensor for name, tensor in state_dict.items() if name in written or _fused_layer(name) in fused}

    def sent(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """The engine now holds the values of every tensor of `state_dict` (the full one `select` was given)."""
        self._at_last_push = {name: tensor_identity(tensor) for name, tensor in state_dict.items()}
        self._last_pushed = dict(state_dict)


def _fused_layer(name: str) -> tuple[str, int, str] | None:
    """`model.layers.1.self_attn.k_proj.weight` -> ("model.layers.1.self_attn", 0, "weight"): the
    fused layer (and the tensor kind) a tensor belongs to; None for a tensor vLLM loads alone."""
    parts = name.split(".")
    if len(parts) < 3:
        return None
    if len(parts) >= 5 and parts[-4] == "experts" and parts[-3].isdigit():
        # An MoE layer's experts (`...mlp.experts.3.down_proj.weight`): vLLM loads them as two packed tensors.
        return (".".join(parts[:-3]), len(FUSED_PROJECTIONS), parts[-1])
    for family, members in enumerate(FUSED_PROJECTIONS):
        if parts[-2] in members:
            return (".".join(parts[:-2]), family, parts[-1])
    return None
