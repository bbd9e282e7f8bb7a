"""A policy's tensors under the names and layout its checkpoint has on disk: what vLLM's loaders read.

transformers (5.x) holds some weights in another layout than its checkpoints: a mixture of experts'
feed-forward is one fused tensor per layer (`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`), where
the checkpoint, and so vLLM's loader, has one per expert (`mlp.experts.3.gate_proj.weight`). It converts
them back when it saves (`save_pretrained`); a weight push takes the same conversion, transformers'
`revert_weight_conversion`. A model without such conversions (the dense tiny policy, SmolLM2) keeps its
names and its tensors (the same storage: a tied embedding stays visibly tied).

`CheckpointLayout` is the way back, for a transformers model that takes versions as the engine does (the
dedicated old-logit worker): where each element of each checkpoint tensor lives in the model's own
tensors, found once by converting tensors of element numbers (`revert_weight_conversion` moves elements
without computing on them: stacking, splitting, concatenating, permuting).
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


class CheckpointLayout:
    """Where the elements of `model`'s checkpoint tensors live in its own tensors.

    Args:
        model: a transformers model as `from_pretrained` loaded it.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        state = model.state_dict()
        on_meta = {name: torch.empty(tensor.shape, dtype=tensor.dtype, device="meta") for name, tensor in state.items()}
        #: The tensors a checkpoint holds under the model's own names, as the model holds them.
        self.same = set(checkpoint_named(model, on_meta)) & set(state)
        converted = [name for name in state if name not in self.same]
        starts: dict[str, int] = {}
        numbers: dict[str, torch.Tensor] = {}
        start = 0
        for name in converted:
            starts[name] = start
            numbers[name] = torch.arange(start, start + state[name].numel()).reshape(state[name].shape)
            start += state[name].numel()
        #: checkpoint name -> (the model tensor its elements come from, their flat positions in it)
        self.places: dict[str, tuple[str, torch.Tensor]] = {}
        for name, elements in (checkpoint_named(model, numbers) if converted else {}).items():
            flat = elements.reshape(-1)
            source = max((owner for owner in converted if starts[owner] <= int(flat[0])), key=starts.__getitem__)
            if int(flat.max()) >= starts[source] + state[source].numel():
                raise ValueError(f"the checkpoint's {name} is made of several of the model's tensors: not supported")
            self.places[name] = (source, flat - starts[source])

    def load(self, model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Write a checkpoint-named `state_dict` (every tensor of a version) into `model`.

        Raises:
            ValueError: when `state_dict` does not hold exactly the checkpoint's tensors.
        """
        expected = self.same | set(self.places)
        if set(state_dict) != expected:
            missing = sorted(expected - set(state_dict))
            unknown = sorted(set(state_dict) - expected)
            raise ValueError(f"a version's tensors do not fit the model: missing {missing[:3]}, unknown {unknown[:3]}")
        model.load_state_dict({name: state_dict[name] for name in self.same}, strict=not self.places)
        own = model.state_dict()
        with torch.no_grad():
            for name, (source, positions) in self.places.items():
                own[source].view(-1)[positions] = state_dict[name].reshape(-1).to(own[source].dtype)
