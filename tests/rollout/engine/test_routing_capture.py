"""The routing recorder's bookkeeping (the engine half of routing replay), on hand-made steps; the real
engine's recordings are checked in tests/integration/test_moe_engine.py."""

from types import SimpleNamespace

import numpy as np
import torch

from lit_asyncrl.rollout.engine import routing_capture
from lit_asyncrl.rollout.engine.routing_capture import RoutingRecorder

#: The fake KV cache: 4 positions a block, each request's blocks ("d" shares "c"'s first block, as a request
#: whose prompt begins with another's takes it from the prefix cache).
BLOCK_SIZE = 4
BLOCKS = {"a": [0, 1], "b": [2, 3], "c": [4, 5], "d": [4, 6]}


def step(runner, requests: list[tuple[str, int, int]]) -> None:
    """Point the fake runner's input batch at `requests`: (engine request id, first position, tokens), with each
    request's row of vLLM's block table."""
    blocks = [BLOCKS[request.rsplit("-", 1)[0]] for request, _, _ in requests]
    table = SimpleNamespace(block_size=BLOCK_SIZE, block_table=SimpleNamespace(np=np.array(blocks)))
    runner.input_batch = SimpleNamespace(
        num_reqs=len(requests),
        req_ids=[request for request, _, _ in requests],
        num_computed_tokens_cpu=np.array([first for _, first, _ in requests]),
        block_table=SimpleNamespace(block_tables=[table]),
    )
    runner.query_start_loc = SimpleNamespace(np=np.cumsum([0, *(tokens for _, _, tokens in requests)]))


def test_each_requests_positions_get_their_rows_of_every_layer_per_version():
    runner = SimpleNamespace()
    recorder = RoutingRecorder(runner, num_layers=2, version=0)
    # A prefill of 3 positions of "a" beside 2 of "b" (from position 4: 0-3 came from the prefix cache).
    step(runner, [("a-1234abcd", 0, 3), ("b-99999999", 4, 2)])
    rows = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7], [1, 0]])
    recorder.capture(0, rows)
    recorder.capture(1, rows + 1)
    # A decode step: one more position each; then "a"'s position 1 computed again (the latest wins).
    step(runner, [("b-99999999", 6, 1), ("a-1234abcd", 3, 1)])
    recorder.capture(0, torch.tensor([[5, 6], [7, 0]]))
    recorder.capture(1, torch.tensor([[5, 6], [7, 0]]))
    step(runner, [("a-1234abcd", 1, 1)])
    recorder.capture(0, torch.tensor([[3, 3]]))
    recorder.capture(1, torch.tensor([[3, 3]]))
    # A push: "b" is computed again from its first position under version 1, which keeps its own routing.
    recorder.version = 1
    step(runner, [("b-99999999", 4, 3)])
    recorder.capture(0, torch.tensor([[2, 4], [6, 0], [1, 3]]))
    recorder.capture(1, torch.tensor([[0, 7], [5, 2], [4, 6]]))
    a = recorder.take("a")
    assert a.keys() == {0}
    assert a[0].tolist() == [
        [[0, 1], [1, 2]],
        [[3, 3], [3, 3]],
        [[4, 5], [5, 6]],
        [[7, 0], [7, 0]],
    ]
    b = recorder.take("b")
    assert b.keys() == {0, 1}
    assert b[0].shape == (7, 2, 2) and (b[0][:4] == -1).all()  # not computed by this request
    assert b[0][4:].tolist() == [[[6, 7], [7, 8]], [[1, 0], [2, 1]], [[5, 6], [5, 6]]]
    assert b[1].shape == (7, 2, 2) and (b[1][:4] == -1).all()
    assert b[1][4:].tolist() == [[[2, 4], [0, 7]], [[6, 0], [5, 2]], [[1, 3], [4, 6]]]
    assert recorder.take("a") == {}  # handed over once


def test_a_forward_that_is_not_the_batchs_is_not_recorded_and_old_requests_are_forgotten(monkeypatch):
    runner = SimpleNamespace()
    recorder = RoutingRecorder(runner, num_layers=1, version=0)
    step(runner, [("a-00000000", 0, 8)])
    recorder.capture(0, torch.zeros(4, 2, dtype=torch.long))  # fewer rows than the batch: a warm-up
    assert recorder.take("a") == {}
    monkeypatch.setattr(routing_capture, "KEPT_REQUESTS", 2)
    for name in ("a", "b", "c"):
        step(runner, [(f"{name}-00000000", 0, 1)])
        recorder.capture(0, torch.zeros(1, 2, dtype=torch.long))
    assert recorder.take("a") == {} and recorder.take("c").keys() == {0}


def test_positions_a_request_took_from_the_prefix_cache_get_the_routing_their_kv_was_computed_with():
    runner = SimpleNamespace()
    recorder = RoutingRecorder(runner, num_layers=1, version=2)
    step(runner, [("c-00000000", 0, 6)])  # "c" computes positions 0-5 (blocks 4 and 5)
    computed = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7], [1, 2], [3, 4]])
    recorder.capture(0, computed)
    # "d" begins with "c"'s first 4 positions: it computes from position 4, its first block taken from the cache.
    step(runner, [("d-00000000", 4, 2)])
    recorder.capture(0, torch.tensor([[5, 6], [7, 1]]))
    step(runner, [("d-00000000", 6, 1)])  # a decode step: nothing more read from the cache
    recorder.capture(0, torch.tensor([[2, 5]]))
    assert recorder.take("d")[2].tolist() == [[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]], [[5, 6]], [[7, 1]], [[2, 5]]]
    assert recorder.take("c")[2][:, 0].tolist() == computed.tolist()


def test_a_request_reads_a_cached_block_another_request_computes_in_the_same_step():
    runner = SimpleNamespace()
    recorder = RoutingRecorder(runner, num_layers=1, version=0)
    # vLLM caches a block when it allocates it: "d", first in the batch, takes "c"'s first block as "c" computes it.
    step(runner, [("d-00000000", 4, 1), ("c-00000000", 0, 4)])
    recorder.capture(0, torch.tensor([[7, 1], [0, 1], [2, 3], [4, 5], [6, 7]]))
    assert recorder.take("d")[0].tolist() == [[[0, 1]], [[2, 3]], [[4, 5]], [[6, 7]], [[7, 1]]]
