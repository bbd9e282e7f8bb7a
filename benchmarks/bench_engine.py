"""The engine's start and its generation beside a training load: worker in the engine-core process
(this library's default on CPU) against vLLM's CPU default (a second spawned worker process).

Each round starts one engine of each kind in turn (the order alternates), on the tiny policy in
fp32, and measures: the start (`VLLMEngine.start`: spawn, imports, model load, KV cache), then
tokens per second over 128 streamed requests of 64 tokens, alone and with a trainer-like load in
this process (a thread multiplying 512x512 matrices, as a training step keeps the cores busy), and
the shutdown. One warm-up request batch per engine comes first. Printed: medians per kind and
in-process / separate-process ratios.

    .venv/bin/python benchmarks/bench_engine.py             # 3 rounds (~4 min on 2 cores)
    .venv/bin/python benchmarks/bench_engine.py --quick     # 1 round
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

import torch

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.rollout.engine import VLLMEngine
from lit_asyncrl.rollout.engine_config import EngineConfig

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


def measure(path, in_process: bool) -> dict[str, float]:
    engine = VLLMEngine(path, EngineConfig(dtype="float32", max_model_len=256, worker_in_engine_process=in_process))
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
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for round_ in range(rounds):
        for in_process in (True, False) if round_ % 2 == 0 else (False, True):
            results[in_process].append(measure(path, in_process))
            print(f"round {round_ + 1}/{rounds} {'in-process' if in_process else 'separate '} {results[in_process][-1]}", flush=True)
    median = {kind: {key: statistics.median(r[key] for r in runs) for key in runs[0]} for kind, runs in results.items()}
    print(f"\n{'':24}{'in-process':>12}{'separate':>12}{'ratio':>8}")
    for key, label in [
        ("start_s", "start (s)"),
        ("shutdown_s", "shutdown (s)"),
        ("alone_tok_s", "tokens/s alone"),
        ("loaded_tok_s", "tokens/s, trainer busy"),
    ]:
        inside, separate = median[True][key], median[False][key]
        print(f"{label:24}{inside:12.1f}{separate:12.1f}{inside / separate:8.2f}")
    print(
        f"\nstart: in-process {median[True]['start_s'] / median[False]['start_s']:.2f}x the time; "
        f"generation with the trainer busy: {median[True]['loaded_tok_s'] / median[False]['loaded_tok_s']:.2f}x the tokens/s"
    )


if __name__ == "__main__":
    main()
