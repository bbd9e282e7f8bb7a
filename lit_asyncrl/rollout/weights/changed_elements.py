"""What of a full fine-tune's new version one engine does not hold yet, element by element
(`rollout.push_changed_elements`, with the staged route).

A full fine-tune writes every tensor at every step, so `changed_tensors.py` sends them all; but in the
engine's dtype most elements keep their value between versions at RL learning rates (bf16 SmolLM2-135M
with AdamW: 0.8-2.8% of the elements change per step, `benchmarks/bench_engine_dtype_changes.py`).
Here a tensor travels as the flat indices (int32) and new values of its changed elements, when that is
smaller than the tensor, and whole otherwise; the engine's staging thread writes them into its own copy
of the previous version (`staged_weights.py`). The comparison is exact: an element travels when its bits
in the engine's dtype differ (a NaN always travels). Costs one copy of the pushed tensors on each side.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

#: Suffixes of a tensor sent as its changed elements: their flat indices, and their new values.
INDEX = ".changed_index"
VALUES = ".changed_values"


class ChangedElements:
    """Per engine: what it holds, and a push's entries against it."""

    def __init__(self) -> None:
        self._held: dict[str, torch.Tensor] = {}  # what the engine holds, in its dtype

    def encode(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The entries of a weights file for `tensors` (already in the engine's dtype): whole, or as
        `<name>.changed_index` and `<name>.changed_values`. From then on the engine counts as holding
        `tensors`: a push that fails raises, and the run ends with it (a new engine starts a new record)."""
        entries: dict[str, torch.Tensor] = {}
        for name, tensor in tensors.items():
            tensor = tensor.detach().to("cpu")
            held = self._held.get(name)
            self._held[name] = tensor.clone()  # the trainer's tensor goes on changing
            if held is None or held.shape != tensor.shape or held.dtype != tensor.dtype:
                entries[name] = tensor
                continue
            changed = _differs(tensor, held).flatten().nonzero().squeeze(1)
            if changed.numel() * (4 + tensor.element_size()) < tensor.numel() * tensor.element_size():
                entries[name + INDEX] = changed.to(torch.int32)
                entries[name + VALUES] = tensor.flatten()[changed]
            else:
                entries[name] = tensor
        return entries


def _differs(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """Elementwise: whether the bits differ (so -0.0 against 0.0 and any NaN count as changed)."""
    if new.element_size() == 2:
        return new.view(torch.int16) != old.view(torch.int16)
    if new.element_size() == 4:
        return new.view(torch.int32) != old.view(torch.int32)
    return new.view(torch.int64) != old.view(torch.int64) if new.element_size() == 8 else new != old


def decode(entries: Mapping[str, torch.Tensor], held: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The engine's side: whole tensors from a file's `entries`, the changed elements written into a
    copy of the engine's own `held` tensor of that name.

    Raises:
        ValueError: changed elements of a tensor the engine does not hold.
    """
    tensors = {name: tensor for name, tensor in entries.items() if not name.endswith((INDEX, VALUES))}
    for key in (key for key in entries if key.endswith(INDEX)):
        name = key.removesuffix(INDEX)
        if name not in held:
            raise ValueError(
                f"changed elements of {name!r} arrived, but the engine holds no earlier {name!r} to write them into"
            )
        tensor = held[name].clone()
        tensor.view(-1)[entries[key].long()] = entries[name + VALUES]
        tensors[name] = tensor
    return tensors
