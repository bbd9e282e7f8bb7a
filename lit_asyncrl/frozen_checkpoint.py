"""Checkpoints hold what trains: the frozen parameters come from the model folder instead.

Under a LoRA adapter the whole base model is frozen, and with `model.train_last_layers` all but a few
layers are; none of them ever changes during a run (they are frozen before the warm start), so a
checkpoint leaves them out (SmolLM2-135M with a rank-8 adapter: the adapter's 9.8 MB, its optimizer
state and the buffers, not 538 MB of base weights) and a resume takes them from the module, which
loaded them from the same model folder. A checkpoint records that folder; loading it into a module
made from another folder is refused.
"""

from __future__ import annotations

from typing import Any

import torch

FROZEN_FROM = "frozen_parameters_from"


def leave_out_frozen(checkpoint: dict[str, Any], module: torch.nn.Module, model_path: str) -> None:
    """Drop from `checkpoint["state_dict"]` every tensor that is a frozen parameter of `module`
    (a tied head goes with the frozen embedding it shares storage with)."""
    if any(hasattr(parameter, "to_local") for parameter in module.parameters()):
        return  # sharded (FSDP2): kept whole, as the strategy writes it
    frozen = {parameter.data_ptr() for parameter in module.parameters() if not parameter.requires_grad}
    if not frozen:
        return
    state = checkpoint["state_dict"]
    for name in [name for name, tensor in state.items() if tensor.data_ptr() in frozen]:
        del state[name]
    checkpoint[FROZEN_FROM] = model_path


def restore_frozen(checkpoint: dict[str, Any], module: torch.nn.Module, model_path: str) -> None:
    """Put the module's own frozen tensors back into a checkpoint that left them out."""
    saved_from = checkpoint.get(FROZEN_FROM)
    if saved_from is None:
        return
    if saved_from != model_path:
        raise ValueError(
            f"the checkpoint left out the frozen parameters of {saved_from} (they never change), but this run loads "
            f"model.path={model_path}: resume with the model the checkpoint was trained from"
        )
    state = checkpoint["state_dict"]
    for name, tensor in module.state_dict().items():
        state.setdefault(name, tensor)
