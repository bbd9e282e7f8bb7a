"""LoRA adapters on the policy (through peft), and what the engine gets of them at each version.

With LoRA on, a weight version is an adapter: the base weights stay as the model folder holds them,
in the trainer and in the engine, and only the adapter's factors A and B are trained and published.
The engine then takes each version as a vLLM LoRA adapter (`rollout/weights/adapters.py`), or, with
`push="merged"`, as full weights with the adapter folded in (for engines or models without LoRA).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.models.checkpoint_names import checkpoint_named

#: The projections of a Llama- or Qwen-style decoder layer: attention and MLP.
ATTENTION_AND_MLP = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_PUSHES = ("adapter", "merged")
TURNS_IN_FLIGHT = ("finish", "move")
#: The ranks vLLM accepts for `max_lora_rank` (its LoRAConfig).
_VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclasses.dataclass(frozen=True)
class LoRASettings:
    """The LoRA adapter the policy trains (`model.lora.*`); rank 0 trains the model itself.

    Args:
        rank: the adapter's rank r; 0 = no adapter (the default).
        alpha: peft's `lora_alpha`: the update is scaled by alpha / rank.
        target_modules: names of the linear layers that get an adapter.
        dropout: peft's `lora_dropout` on the adapter's input while training (the engine samples
            without it, so anything above 0 adds a training-inference discrepancy of its own).
        push: how each version reaches the engine: "adapter" (the adapter's tensors only; the
            engine holds one adapter per live version) or "merged" (full weights with the adapter
            folded in, for engines without LoRA support).
        in_flight: what a turn in flight at a push does with `push="adapter"`: "finish" on the
            adapter it started with (its tokens all carry that version; the next turn takes the
            new one) or "move" to the new adapter at the push (its tokens up to the push carry the
            old version, the rest the new one, as with full weights; the move costs the engine a
            prefill of the turn so far). interrupt_sync and dedicated need "move".
    """

    rank: int = 0
    alpha: float = 16.0
    target_modules: tuple[str, ...] = ATTENTION_AND_MLP
    dropout: float = 0.0
    push: str = "adapter"
    in_flight: str = "finish"

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(
                f"{config_key('model.lora.rank')} must be an integer >= 0 (0 = no adapter), got {self.rank!r}"
            )
        if self.rank > _VLLM_RANKS[-1]:
            raise ValueError(
                f"{config_key('model.lora.rank')}={self.rank}: vLLM serves adapters up to rank {_VLLM_RANKS[-1]}"
            )
        if not self.alpha > 0:
            raise ValueError(f"{config_key('model.lora.alpha')} must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"{config_key('model.lora.dropout')} must be in [0, 1), got {self.dropout!r}")
        if self.push not in LORA_PUSHES:
            raise ValueError(f"{config_key('model.lora.push')}={self.push!r}: choose one of {', '.join(LORA_PUSHES)}")
        if self.in_flight not in TURNS_IN_FLIGHT:
            raise ValueError(
                f"{config_key('model.lora.in_flight')}={self.in_flight!r}: choose one of {', '.join(TURNS_IN_FLIGHT)}"
            )
        if self.enabled and not self.target_modules:
            raise ValueError(
                f"{config_key('model.lora.target_modules')} is empty: name the linear layers that get an adapter"
            )
        object.__setattr__(self, "target_modules", tuple(self.target_modules))

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def serves_adapters(self) -> bool:
        """Whether the engine takes each version as an adapter (else as full weights)."""
        return self.enabled and self.push == "adapter"

    @property
    def moves_turns(self) -> bool:
        """Whether a turn in flight at a push moves to the new adapter (see `in_flight`)."""
        return self.serves_adapters and self.in_flight == "move"

    def engine_max_rank(self) -> int:
        """vLLM's `max_lora_rank` for this adapter: the smallest rank vLLM accepts that holds it."""
        return next(rank for rank in _VLLM_RANKS if rank >= self.rank)

    def peft_config(self) -> Any:
        """peft's `LoraConfig` for these settings (the trainer's adapter and the engine's files)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            target_modules=list(self.target_modules),
            lora_dropout=self.dropout,
            bias="none",
            task_type="CAUSAL_LM",
        )


def add_adapter(policy: torch.nn.Module, settings: LoRASettings) -> torch.nn.Module:
    """`policy` wrapped by peft with a fresh adapter (B = 0: the wrapped policy equals the base).

    peft freezes every base parameter, so an optimizer over the parameters that require a gradient
    sees only the adapter's.
    """
    from peft import get_peft_model

    missing = [
        name
        for name in settings.target_modules
        if not any(module.endswith(f".{name}") for module, _ in policy.named_modules())
    ]
    if missing:
        raise ValueError(
            f"{config_key('model.lora.target_modules')}: "
            f"{type(policy).__name__} has no layer named {', '.join(missing)}"
        )
    return get_peft_model(policy, settings.peft_config())


def is_adapted(policy: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(policy, PeftModel)


def adapter_weights(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors as peft saves them (`adapter_model.safetensors`, which vLLM loads)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(policy)


def merged_weights(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's tensors under their own names, each adapted layer's weight as W + B·A·scale.

    Computed beside the base weights, not by peft's in-place merge: merging and unmerging every
    version would leave rounding in the base weights that builds up over a run.
    """
    from peft.tuners.lora import LoraLayer

    base = policy.get_base_model()
    merged = dict(base.state_dict())
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            deltas = [module.get_delta_weight(adapter) for adapter in module.active_adapters]
            merged[f"{name}.weight"] = module.get_base_layer().weight + sum(deltas)
    # The adapter's own tensors and the wrapped layers' `base_layer` names are not the model's.
    model_own = {
        name: tensor.detach() for name, tensor in merged.items() if ".lora_" not in name and ".base_layer." not in name
    }
    return checkpoint_named(base, model_own)


def engine_weights(policy: torch.nn.Module, settings: LoRASettings) -> Mapping[str, torch.Tensor]:
    """What a version sends to the engine: the adapter, the merged weights, or the whole state dict
    (those two under the checkpoint's names and layout: `checkpoint_names.py`)."""
    if not is_adapted(policy):
        return checkpoint_named(policy, policy.state_dict())
    return adapter_weights(policy) if settings.serves_adapters else merged_weights(policy)
