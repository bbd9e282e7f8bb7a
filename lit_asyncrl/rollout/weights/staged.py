"""The staged push (`rollout.weight_transfer=staged`): a version's weights are prepared inside the
engine while it keeps generating, and the engine stands still only to swap them in.

On CPU, vLLM's reload (the `file` route) pauses the engine while it reads the file, loads each
layer and re-packs every linear layer for oneDNN (`dispatch_cpu_unquantized_gemm`): about a
quarter of the pause is the re-pack alone (`benchmarks/bench_cpu_repack.py`). Here a thread of the
engine-core process reads the file, fuses the projections as vLLM fuses them (its model's
`packed_modules_mapping`: q/k/v into `qkv_proj`, gate/up into `gate_up_proj`) and builds each
layer's packed kernel with vLLM's own dispatch, while the engine steps; the pause then only points
each layer at its new kernel and each other parameter at its new tensor.

A mixture of experts' routed experts are stacked per layer from the checkpoint's per-expert tensors
and packed by the layer's own kernel in the same way (`packed_experts`).

`StagedWeightsExtension` is mixed into vLLM's worker (`worker_extension_cls`) and called through
`collective_rpc`; `file_routes.py` is the trainer's side of both file routes. Llama-family layouts on CPU, tensor
parallel size 1 (a fused layer is its parts stacked along the output dimension).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import torch


class StagedWeightsExtension:
    """Methods vLLM adds to its worker (`self.model_runner` is the worker's)."""

    def stage_weights(self, path: str, elements: bool) -> None:
        """Start preparing the weights file `path` on a thread; the engine goes on generating. With
        `elements` the engine keeps each tensor it loads, to write later changed elements into."""
        retired = getattr(self, "_retired", [])
        self._retired = []
        if elements and not hasattr(self, "_held"):
            self._held: dict[str, torch.Tensor] = {}
        self._staged = StagedVersion(self.model_runner.get_model(), path, retired, self._held if elements else None)

    def staged_weights_ready(self) -> bool:
        """Whether the staging is done (raises what it failed with)."""
        return self._staged.ready()

    def swap_staged_weights(self) -> None:
        """Point the model at the staged weights (the engine is paused)."""
        self._retired = self._staged.swap()
        self._staged = None


class StagedVersion:
    """One version's packed kernels and tensors, prepared on a thread."""

    def __init__(self, model: torch.nn.Module, path: str, retired: list, held: dict[str, torch.Tensor] | None) -> None:
        """`retired`: what the previous swap replaced, freed on the thread (freeing the weights of a
        whole model took the pause from 0.04 s to 0.12 s on SmolLM2-135M); `held`: the engine's own
        copy of each tensor, when the file may hold changed elements (updated here)."""
        self.kernels: list[tuple[torch.nn.Module, Any]] = []  # (layer, its new packed `cpu_linear`)
        self.tensors: list[tuple[torch.nn.Parameter, torch.Tensor]] = []  # (parameter, its new values)
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._stage, args=(model, path, retired, held), name="staged-weights", daemon=True
        )
        self._thread.start()

    def ready(self) -> bool:
        if self._thread.is_alive():
            return False
        if self._error is not None:
            raise RuntimeError(f"staging the weights failed: {self._error!r}") from self._error
        return True

    def swap(self) -> list:
        """Point the layers at the new kernels and the parameters at the new values; returns what they held."""
        self._thread.join()
        replaced = [layer.cpu_linear for layer, _ in self.kernels] + [parameter.data for parameter, _ in self.tensors]
        for layer, kernel in self.kernels:
            layer.cpu_linear = kernel
        for parameter, values in self.tensors:
            parameter.data = values  # a tied head shares this parameter with the embedding
        self.kernels = []
        self.tensors = []
        return replaced

    def _stage(self, model: torch.nn.Module, path: str, retired: list, held: dict[str, torch.Tensor] | None) -> None:
        retired.clear()
        try:
            from safetensors.torch import load_file

            from lit_asyncrl.rollout.weights.changed_elements import decode

            loaded = load_file(path) if held is None else decode(load_file(path), held)
            self._prepare(model, loaded)
            if held is not None:
                held.update(loaded)
        except BaseException as error:  # reported to the trainer by `ready`
            self._error = error

    def _prepare(self, model: torch.nn.Module, loaded: dict[str, torch.Tensor]) -> None:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

        packed = getattr(model, "packed_modules_mapping", {})
        used: set[str] = set()
        for module_name, module in model.named_modules():
            if is_routed_experts(module):
                self.tensors += packed_experts(module_name, module, loaded, used)
        new_values: dict[int, torch.Tensor] = {}  # by parameter identity: a tied one is staged once

        def values_for(module_name: str, attribute: str, parameter: torch.Tensor) -> torch.Tensor | None:
            """The new values of `parameter` (empty when vLLM keeps the layer only packed: no shape to match)."""
            names = checkpoint_names(module_name, attribute, packed)
            if module_name == "model.embed_tokens" and names[0] not in loaded and model_is_tied(model):
                names = ["lm_head.weight"]  # a tied embedding travels as the head
            present = [name for name in names if name in loaded]
            if not present:
                return None
            if len(present) < len(names):
                raise ValueError(f"{module_name}.{attribute} is made of {names}, the weights file has only {present}")
            used.update(names)
            values = torch.cat([loaded[name] for name in names]) if len(names) > 1 else loaded[names[0]]
            # An embedding's rows padded to vLLM's vocabulary multiple.
            if parameter.numel() and values.shape != parameter.shape:
                values = torch.cat([values, parameter.data[values.shape[0] :]])
            return values.to(parameter.dtype)

        for module_name, module in model.named_modules():
            for attribute, parameter in module.named_parameters(recurse=False):
                if parameter.numel() == 0 or id(parameter) in new_values:
                    continue  # a linear weight vLLM keeps only packed (below), or a tied one met before
                values = values_for(module_name, attribute, parameter)
                if values is not None:
                    new_values[id(parameter)] = values
                    self.tensors.append((parameter, values))
        for module_name, module in model.named_modules():
            if not hasattr(module, "cpu_linear") or (
                isinstance(module, VocabParallelEmbedding) and not isinstance(module, ParallelLMHead)
            ):
                continue  # an input embedding is looked up, never multiplied
            weight = (
                new_values.get(id(module.weight))
                if module.weight.numel()
                else values_for(module_name, "weight", module.weight)
            )
            if weight is None:
                continue
            stand_in = SimpleNamespace(weight=weight)
            dispatch_cpu_unquantized_gemm(stand_in, remove_weight=True)  # packs as the load did
            self.kernels.append((module, stand_in.cpu_linear))
        unknown = sorted(set(loaded) - used)
        if unknown:
            raise ValueError(f"the staged push found no place in the engine's model for {unknown[:5]}")


def is_routed_experts(module: torch.nn.Module) -> bool:
    """Whether `module` is a vLLM MoE layer's routed experts (every expert's weights in two tensors)."""
    return hasattr(module, "w13_weight") and hasattr(module, "w2_weight") and hasattr(module, "quant_method")


def packed_experts(
    module_name: str, module: torch.nn.Module, loaded: dict[str, torch.Tensor], used: set[str]
) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
    """The new values of an MoE layer's `w13_weight` and `w2_weight` from the checkpoint's per-expert
    tensors, laid out and packed as vLLM's first load leaves them: each expert's gate and up
    projections stacked ([experts, 2 x intermediate, hidden]) and its down projection, converted and
    packed by the layer's own kernel (on CPU, padded and pre-packed for its grouped GEMM). vLLM's reload
    and its weight-transfer API write a new version into the packed tensors unpacked (measured: 0.11 nats
    off the trainer), which is why an MoE policy on CPU takes this route. Empty when the file holds none
    of the layer's experts."""
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import convert_to_unquantized_kernel_format

    container = module_name.removesuffix(".routed_experts")
    projections = (module.ckpt_gate_proj_name, module.ckpt_up_proj_name, module.ckpt_down_proj_name)
    names = [
        [f"{container}.{expert}.{name}.weight" for name in projections] for expert in range(module.w13_weight.shape[0])
    ]
    present = [name for expert in names for name in expert if name in loaded]
    if not present:
        return []
    if len(present) < 3 * len(names):
        raise ValueError(f"{module_name}: the weights file has {len(present)} of its {3 * len(names)} expert tensors")
    used.update(present)
    dtype = module.w13_weight.dtype
    w13 = torch.stack([torch.cat([loaded[gate], loaded[up]]) for gate, up, _ in names]).to(dtype)
    w2 = torch.stack([loaded[down] for _, _, down in names]).to(dtype)
    method = module.quant_method
    stand_in = torch.nn.Module()  # what the layer's kernel packs, in place of the layer itself
    stand_in.moe_config = module.moe_config
    w13, w2 = convert_to_unquantized_kernel_format(
        method.unquantized_backend, moe_config=module.moe_config, w13_weight=w13, w2_weight=w2, layer=stand_in
    )
    stand_in.w13_weight = torch.nn.Parameter(w13, requires_grad=False)
    stand_in.w2_weight = torch.nn.Parameter(w2, requires_grad=False)
    method.moe_kernel.fused_experts.process_weights_after_loading(stand_in)
    return [(module.w13_weight, stand_in.w13_weight.data), (module.w2_weight, stand_in.w2_weight.data)]


def checkpoint_names(module_name: str, attribute: str, packed: dict[str, list[str]]) -> list[str]:
    """The checkpoint's names of a vLLM parameter: `model.layers.0.self_attn.qkv_proj` + `weight` ->
    the q, k and v projections' weights (in the order vLLM stacks them); any other, its own name."""
    prefix, _, last = module_name.rpartition(".")
    members = packed.get(last, [last])
    return [".".join(filter(None, (prefix, member, attribute))) for member in members]


def model_is_tied(model: torch.nn.Module) -> bool:
    head = getattr(model, "lm_head", None)
    embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
    return head is not None and embedding is not None and head.weight is embedding.weight
