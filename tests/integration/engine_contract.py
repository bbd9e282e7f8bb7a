"""The `Engine` protocol's checks, run against each engine implementation on a started engine.

What the producer, the episode runner and the rollout service rely on: `run` reaches the engine's
loop; a turn comes back with one mu and one version per token, all of the engine's version; a
pause freezes a request in flight and `resume` lets it finish; a push makes the next tokens carry
the new version, and a push of weights not written since sends nothing; `dead_reason` is None while
the engine is healthy.
"""

import asyncio
import math
import threading
import time

from lit_asyncrl.rollout.engine.protocol import Engine


def check_engine_contract(engine: Engine, weights: dict, sent_again: bool = False) -> None:
    """`weights`: a state dict the engine's model takes (pushed as the next version), or with adapters
    as versions the adapter's tensors; an fp32 engine. `sent_again`: the route sends a version whole
    even when nothing was written since (an adapter is a version on its own)."""
    assert isinstance(engine, Engine)
    assert engine.dead_reason() is None

    async def running_loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    assert engine.run(running_loop(), timeout_s=30) is engine.loop

    version = engine.version
    turn = engine.run(engine.generate([1], max_tokens=8, temperature=1.0, ignore_eos=True), timeout_s=60)
    assert len(turn.token_ids) == len(turn.logprobs) == 8
    assert turn.versions == [version] * 8
    assert all(math.isfinite(mu) and mu <= 0.0 for mu in turn.logprobs)
    assert turn.finish_reason == "length"

    streamed, started = [0], threading.Event()

    def on_tokens(ids: list[int], logprobs: list[float]) -> None:
        streamed[0] += len(ids)
        started.set()

    pending = asyncio.run_coroutine_threadsafe(
        engine.generate([1], max_tokens=200, temperature=1.0, ignore_eos=True, on_tokens=on_tokens), engine.loop
    )
    assert started.wait(60)
    engine.pause()
    at_pause = streamed[0]
    time.sleep(0.5)
    assert streamed[0] == at_pause < 200  # frozen, not finished
    assert engine.dead_reason() is None  # a pause on purpose is no stall
    engine.resume()
    assert len(pending.result(timeout=60).token_ids) == 200

    timings = engine.push_weights(weights, version + 1)
    assert min(timings.write_s, timings.pause_s) >= 0.0
    # An fp32 engine loads 4 bytes per element of each tensor of the state dict; a tied embedding,
    # named twice in a state dict, travels once (as the head).
    distinct = {tensor.data_ptr(): tensor for tensor in weights.values()}
    assert timings.bytes == 4 * sum(tensor.numel() for tensor in distinct.values())
    assert engine.version == version + 1
    turn = engine.run(engine.generate([1], max_tokens=4, temperature=1.0, ignore_eos=True), timeout_s=60)
    assert turn.versions == [version + 1] * 4
    # Nothing written since: nothing travels and only the label moves (an adapter travels whole again).
    again = engine.push_weights(weights, version + 2)
    assert again.bytes == (timings.bytes if sent_again else 0) and engine.version == version + 2
    turn = engine.run(engine.generate([1], max_tokens=4, temperature=1.0, ignore_eos=True), timeout_s=60)
    assert turn.versions == [version + 2] * 4
