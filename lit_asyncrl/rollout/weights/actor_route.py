"""The route to an engine in a Ray actor on the file routes: the tensors through Ray's object store."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import torch

from lit_asyncrl.rollout.weights.route import WeightPush, WeightRoute
from lit_asyncrl.rollout.weights.transfer import tied_once


class ActorRoute(WeightRoute):
    """A version's tensors sent through Ray's object store to the engine's actor, whose engine
    loads them by its own route (a file, or an adapter); `engine` is a `RayEngine`."""

    def send(self, engine: Any, tensors: Mapping[str, torch.Tensor], version: int) -> WeightPush:
        start = time.perf_counter()
        on_cpu = {name: tensor.detach().to("cpu").contiguous() for name, tensor in tied_once(tensors).items()}
        pushed = engine.push_in_actor(on_cpu, version)
        # `write_s` here also counts the trip through Ray's object store.
        return dataclasses.replace(pushed, write_s=time.perf_counter() - start - pushed.pause_s)
