"""Where the engines and the dedicated old-logit worker run: started by this process, or Ray actors."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
from lit_asyncrl.rollout.old_logits.dedicated import DedicatedWorkerProcess
from lit_asyncrl.rollout.settings import ScaleOutSettings


def placement_factories(settings: ScaleOutSettings) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(engine factory, old-logit worker factory) for `settings.placement`: `VLLMEngine` and
    `DedicatedWorkerProcess` here, or `RayEngine` and `DedicatedWorkerActor` partials with the actors' resources."""
    if settings.placement == "local":
        return VLLMEngine, DedicatedWorkerProcess
    if importlib.util.find_spec("ray") is None:
        placement_key = config_key("rollout.placement")
        raise ValueError(
            f'{placement_key}=ray needs Ray: pip install "lit-asyncrl[ray]" (or set {placement_key}=local)'
        )
    from lit_asyncrl.rollout.ray_actors.dedicated_worker import DedicatedWorkerActor
    from lit_asyncrl.rollout.ray_actors.engine import RayEngine
    from lit_asyncrl.rollout.ray_actors.placement import RayPlacement

    resources = RayPlacement(
        address=settings.ray_address, num_cpus=settings.ray_cpus_per_engine, num_gpus=settings.ray_gpus_per_engine
    )
    return functools.partial(RayEngine, placement=resources), functools.partial(
        DedicatedWorkerActor, placement=resources
    )
