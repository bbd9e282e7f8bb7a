"""What a turn in flight does at an adapter push: finish on its adapter, or move to the new one.

Two real vLLM engines (fp32, LoRA enabled) on the same model, one per `model.lora.in_flight`. Each
round runs `--turns` concurrent turns of `--tokens` tokens (ignore_eos) on one engine while the
trainer's side pushes a new adapter every `--push-every-s` seconds the way the dedicated and
interruption-sync routes do (pause, push; the push resumes the engine and, with `move`, moves the
turns in flight). The engines take turns, order alternating, after a warm-up round; medians.

    .venv/bin/python benchmarks/bench_lora_in_flight.py            # SmolLM2-135M, rank 8
    .venv/bin/python benchmarks/bench_lora_in_flight.py --tiny     # the 0.3M tiny policy
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.models.lora import TURNS_IN_FLIGHT, LoRASettings, adapter_weights, add_adapter
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine


def one_round(engine: VLLMEngine, adapter: dict, version: int, turns: int, tokens: int, push_every_s: float) -> dict:
    async def all_turns():
        return await asyncio.gather(
            *(engine.generate([1 + i], max_tokens=tokens, temperature=1.0, ignore_eos=True) for i in range(turns))
        )

    start = time.perf_counter()
    pending = asyncio.run_coroutine_threadsafe(all_turns(), engine.loop)
    moved = pushes = 0
    while not pending.done():
        time.sleep(push_every_s)
        if pending.done():
            break
        version += 1
        engine.pause()
        moved += (
            engine.push_weights(
                {name: tensor + 0.01 * version for name, tensor in adapter.items()}, version
            ).moved_turns
            or 0
        )
        pushes += 1
    outputs = pending.result()
    seconds = time.perf_counter() - start
    return {
        "tokens_per_s": sum(len(o.token_ids) for o in outputs) / seconds,
        "moved": moved,
        "pushes": pushes,
        "version": version,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--push-every-s", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    name, path = (
        ("tiny 0.3M", resolve_model_path(None)) if args.tiny else ("SmolLM2-135M", resolve_model_path("smollm2_135m"))
    )
    torch.manual_seed(0)
    adapter = adapter_weights(
        add_adapter(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), LoRASettings(rank=8))
    )
    engines = {}
    for mode in TURNS_IN_FLIGHT:
        config = EngineSettings(dtype="float32", max_model_len=512, lora=LoRASettings(rank=8, in_flight=mode))
        engines[mode] = VLLMEngine(path, config)
        engines[mode].start()
    results = {mode: [] for mode in TURNS_IN_FLIGHT}
    versions = dict.fromkeys(TURNS_IN_FLIGHT, 1)
    try:
        for mode in TURNS_IN_FLIGHT:
            engines[mode].push_weights(adapter, 1)
        for round_ in range(args.repeats + 1):  # round 0 warms up
            order = TURNS_IN_FLIGHT if round_ % 2 == 0 else TURNS_IN_FLIGHT[::-1]
            for mode in order:
                result = one_round(engines[mode], adapter, versions[mode], args.turns, args.tokens, args.push_every_s)
                versions[mode] = result["version"]
                if round_ > 0:
                    results[mode].append(result)
    finally:
        for engine in engines.values():
            engine.shutdown()
    print(
        f"{name}, rank 8, {args.turns} turns x {args.tokens} tokens, a push every {args.push_every_s} s; {args.repeats} rounds"
    )
    print("| in_flight | tokens/s per round | median | pushes per round | turns moved per round |")
    print("|---|---|---:|---|---|")
    for mode, rounds in results.items():
        rates = [r["tokens_per_s"] for r in rounds]
        print(
            f"| {mode} | {', '.join(f'{rate:.0f}' for rate in rates)} | {statistics.median(rates):.0f} | "
            f"{', '.join(str(r['pushes']) for r in rounds)} | {', '.join(str(int(r['moved'])) for r in rounds)} |"
        )
    ratios = [m["tokens_per_s"] / f["tokens_per_s"] for m, f in zip(results["move"], results["finish"])]
    print(
        f"move / finish tokens/s per round: {', '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
