"""Everything this library adds to vLLM's worker (`worker_extension_cls`), reached through `collective_rpc`:
the staged weight push (`weights/staged.py`) and the capture of an MoE's routed experts (`routing_capture.py`).
vLLM takes one extension class per engine, so both live in this one."""

from lit_asyncrl.rollout.engine.routing_capture import RoutingCaptureExtension
from lit_asyncrl.rollout.weights.staged import StagedWeightsExtension


class EngineWorkerExtension(StagedWeightsExtension, RoutingCaptureExtension):
    """The staged push's methods and the routing capture's."""
