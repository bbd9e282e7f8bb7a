"""The bookkeeping of an engine's adapters, with the engine's removal call recorded (the real
engine's adapters are checked in `tests/integration/test_lora_runs.py`): each push takes a new LoRA
id, a request keeps the adapter it started with, and an adapter goes (from the engine and from disk)
at the first push after it is neither the newest nor in use."""

import json

import pytest
import torch
from safetensors.torch import load_file

from lit_asyncrl.models.lora import LoRASettings
from lit_asyncrl.rollout.weights.adapters import ADAPTER_FILE, EngineAdapters


def push(adapters, removed, version, value=0.0):
    tensors = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.full((8, 128), value)}
    return adapters.push(tensors, version, removed.append)


def test_a_request_keeps_its_adapter_and_unused_adapters_go_at_the_next_push(tmp_path):
    adapters, removed = EngineAdapters(LoRASettings(rank=8, alpha=32.0), tmp_path), []
    timings = push(adapters, removed, version=0, value=1.0)
    assert (timings.bytes, timings.pause_s) == (8 * 128 * 4, 0.0)
    first = adapters.begin()
    assert (first.lora_id, first.version) == (1, 0)
    # The adapter's files are peft's: its config (rank, alpha, targets) and the tensors pushed.
    config = json.loads((tmp_path / "adapter-1-v0" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == (
        8,
        32.0,
        sorted(LoRASettings().target_modules),
    )
    assert torch.equal(
        load_file(tmp_path / "adapter-1-v0" / ADAPTER_FILE)[
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
        ],
        torch.ones(8, 128),
    )

    push(adapters, removed, version=1)  # version 0 is still in use: it stays
    second = adapters.begin()
    assert (second.lora_id, second.version) == (2, 1)
    assert adapters.resident_versions == [0, 1]
    adapters.end(first)
    adapters.end(second)
    assert removed == []
    push(adapters, removed, version=2)  # neither is newest nor in use now
    assert adapters.resident_versions == [2]
    assert removed == [1, 2]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["adapter-3-v2"]


def test_the_same_version_pushed_again_gets_a_new_id(tmp_path):
    # vLLM keeps an adapter it has loaded under its id: reusing one would serve the old tensors.
    adapters, removed = EngineAdapters(LoRASettings(rank=8), tmp_path), []
    push(adapters, removed, version=5)
    push(adapters, removed, version=5)
    assert removed == [1]
    assert adapters.begin().lora_id == 2


def test_no_request_starts_before_the_first_adapter(tmp_path):
    with pytest.raises(RuntimeError, match="no adapter pushed yet"):
        EngineAdapters(LoRASettings(rank=8), tmp_path).begin()


class Finished:
    def __init__(self, reason):
        self.finish_reason = reason


def test_a_moved_turn_continues_under_the_new_adapter_with_its_tokens_so_far_in_the_prompt(tmp_path):
    # The engine's requests stand in: the first is aborted after 3 tokens when a push moves it, the
    # second continues the turn from the prompt plus those 3 tokens for the 2 tokens left.
    import asyncio

    adapters, removed = EngineAdapters(LoRASettings(rank=8, in_flight="move"), tmp_path), []
    push(adapters, removed, version=4)
    requests = []

    async def stream(prompt, max_tokens, lora_request, request_id):
        requests.append((prompt, max_tokens, lora_request.lora_int_id))
        if len(requests) == 1:
            push(adapters, removed, version=5)
            assert adapters.requests_to_move() == [request_id]  # the engine aborts it
            return [7, 8, 9], [-0.1, -0.2, -0.3], Finished("abort")
        return [10, 11], [-0.4, -0.5], Finished("length")

    token_ids, logprobs, versions, final = asyncio.run(adapters.generate(stream, [1, 2], max_tokens=5))
    assert requests == [([1, 2], 5, 1), ([1, 2, 7, 8, 9], 2, 2)]
    assert (token_ids, logprobs, versions) == ([7, 8, 9, 10, 11], [-0.1, -0.2, -0.3, -0.4, -0.5], [4, 4, 4, 5, 5])
    assert final.finish_reason == "length"
    assert adapters.requests_to_move() == []  # nothing runs on an old adapter any more


def test_with_finish_no_turn_moves_and_an_abort_of_another_cause_ends_the_turn(tmp_path):
    import asyncio

    adapters, removed = EngineAdapters(LoRASettings(rank=8), tmp_path), []
    push(adapters, removed, version=0)
    calls = []

    async def stream(prompt, max_tokens, lora_request, request_id):
        calls.append(prompt)
        push(adapters, removed, version=1)
        assert adapters.requests_to_move() == []  # in_flight="finish": it runs on under version 0
        return [3], [-1.0], Finished("abort")  # aborted by someone else: not continued

    token_ids, _, versions, final = asyncio.run(adapters.generate(stream, [1], max_tokens=4))
    assert (calls, token_ids, versions, final.finish_reason) == ([[1]], [3], [0], "abort")


def test_a_moving_turn_that_the_engine_does_not_hold_yet_is_aborted_once_it_does(tmp_path):
    # Three turns move at a push: "held" is in the engine already, "late" is added two loop turns
    # later (vLLM processes a request's input before it holds it, and drops an abort of one it does
    # not hold), "gone" ends without ever being added. Each held one is aborted once, none before
    # the engine holds it, and the wait ends when nothing is left to abort.
    import asyncio

    adapters, removed = EngineAdapters(LoRASettings(rank=8, in_flight="move"), tmp_path), []
    push(adapters, removed, version=0)
    uses = {name: adapters.begin(name) for name in ("held", "late", "gone")}
    push(adapters, removed, version=1)
    moving = adapters.requests_to_move()
    assert sorted(moving) == ["gone", "held", "late"]
    held = {"held"}
    aborted = []

    async def abort(request_ids):
        assert set(request_ids) <= held
        aborted.append(sorted(request_ids))

    async def engine_side():
        await asyncio.sleep(0)
        adapters.end(uses["gone"])
        await asyncio.sleep(0)
        held.add("late")

    async def push_side():
        await asyncio.gather(adapters.abort_once_held(moving, held, abort), engine_side())

    asyncio.run(push_side())
    assert aborted == [["held"], ["late"]]
