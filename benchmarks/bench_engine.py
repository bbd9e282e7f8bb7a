"""The engine's start and its generation beside a training load, for three ways to run the CPU engine:

- forked: the worker inside the engine-core process, forked from this one (this library's default
  on CPU, `rollout/processes/core_fork.py`);
- spawned: the same, spawned (`VLLM_WORKER_MULTIPROC_METHOD=spawn`), so it imports vLLM, torch and
  this script's imports again;
- separate: vLLM's CPU default, a spawned engine core with a second spawned worker process.

Each round starts one engine of each kind in turn (the order rotates), on the tiny policy in fp32,
and measures: the start (`VLLMEngine.start`: the process, imports, model load, KV cache), then
tokens per second over 128 streamed requests of 64 tokens, alone and with a trainer-like load in
this process (a thread multiplying 512x512 matrices, as a training step keeps the cores busy), and
the shutdown. One warm-up request batch per engine comes first. Printed: medians per kind and
their ratios to the forked engine.

    .venv/bin/python benchmarks/bench_engine.py             # 3 rounds (~4 min on 2 cores)
    .venv/bin/python benchmarks/bench_engine.py --quick     # 1 round
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time

import torch

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine

REQUESTS, TOKENS = 128, 64


def busy_trainer(stop: threading.Event) -> None:
    matrix = torch.randn(512, 512)
    while not stop.is_set():
        matrix = (matrix @ matrix).tanh()


def tokens_per_second(engine: VLLMEngine, requests: int) -> float:
    async def batch() -> int:
        turns = await asyncio.gather(
            *[engine.generate([1, 2, 3], max_tokens=TOKENS, temperature=1.0, ignore_eos=True) for _ in range(requests)]
        )
        return sum(len(turn.token_ids) for turn in turns)

    started = time.perf_counter()
    tokens = engine.run(batch(), timeout_s=600)
    return tokens / (time.perf_counter() - started)


#: kind -> (worker in the engine-core process, vLLM's start method for it)
KINDS = {"forked": (True, None), "spawned": (True, "spawn"), "separate": (False, None)}


def measure(path, kind: str) -> dict[str, float]:
    in_process, start_method = KINDS[kind]
    engine = VLLMEngine(path, EngineSettings(dtype="float32", max_model_len=256, worker_in_engine_process=in_process))
    if start_method is None:
        os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    else:
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = start_method
    started = time.perf_counter()
    engine.start()
    result = {"start_s": time.perf_counter() - started}
    try:
        tokens_per_second(engine, 32)  # warm-up
        result["alone_tok_s"] = tokens_per_second(engine, REQUESTS)
        stop = threading.Event()
        load = threading.Thread(target=busy_trainer, args=(stop,), daemon=True)
        load.start()
        try:
            result["loaded_tok_s"] = tokens_per_second(engine, REQUESTS)
        finally:
            stop.set()
            load.join()
    finally:
        started = time.perf_counter()
        engine.shutdown()
        result["shutdown_s"] = time.perf_counter() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round")
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    path = resolve_model_path(None)
    kinds = list(KINDS)
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for round_ in range(rounds):
        for kind in kinds[round_ % 3 :] + kinds[: round_ % 3]:
            results[kind].append(measure(path, kind))
            print(f"round {round_ + 1}/{rounds} {kind:9} {results[kind][-1]}", flush=True)
    median = {kind: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for kind, runs in results.items()}
    print(
        f"\n{'':24}"
        + "".join(f"{kind:>10}" for kind in kinds)
        + "".join(f"{kind + '/forked':>17}" for kind in kinds[1:])
    )
    for key, label in [
        ("start_s", "start (s)"),
        ("shutdown_s", "shutdown (s)"),
        ("alone_tok_s", "tokens/s alone"),
        ("loaded_tok_s", "tokens/s, trainer busy"),
    ]:
        values = [median[kind][key] for kind in kinds]
        print(
            f"{label:24}"
            + "".join(f"{value:10.1f}" for value in values)
            + "".join(f"{value / values[0]:17.2f}" for value in values[1:])
        )


if __name__ == "__main__":
    main()
