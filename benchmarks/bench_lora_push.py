"""LoRA versions: the adapter push against the merged push and a plain copy of the adapter's bytes,
and a training step with the adapter against one that trains the last 2 layers.

Two real vLLM engines (fp32) on the same model: one with LoRA enabled takes each version as an
adapter (`model.lora.push=adapter`: peft's files written, loaded by the engine core when the first
request names it, generation never paused); the other takes the adapter folded into full weights
(`push=merged`, the `file` route: a safetensors file reloaded while the engine is paused). Each
round perturbs the adapter, builds what each push sends from the trainer's PeftModel
(`engine_weights`, timed as `prepare`), pushes it with `VLLMEngine.push_weights` (the order
alternates), then times one token generated under the new version (for the adapter, this is where
the engine loads it); and it copies the adapter's tensors into preallocated buffers
(`torch._foreach_copy_`). Medians after warm-up rounds. The step rows time forward + backward +
AdamW on one batch (8 sequences of 128 tokens), alternating the two set-ups.

    .venv/bin/python benchmarks/bench_lora_push.py            # SmolLM2-135M, rank 8 (~3 min on 2 cores)
    .venv/bin/python benchmarks/bench_lora_push.py --tiny     # the 0.3M tiny policy instead
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.models.lora import LoRASettings, adapter_weights, add_adapter, engine_weights
from lit_asyncrl.module import freeze_all_but_last_layers
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine

PUSHES = ("adapter", "merged")


def nbytes(tensors) -> int:
    """Bytes of distinct storage (a tied head counts once)."""
    return sum(t.numel() * t.element_size() for t in {t.data_ptr(): t for t in tensors.values()}.values())


def measure_pushes(path: str, rank: int, repeats: int, warmup: int) -> dict:
    torch.manual_seed(0)
    policy = add_adapter(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), LoRASettings(rank=rank))
    settings = {push: LoRASettings(rank=rank, push=push) for push in PUSHES}
    adapter = adapter_weights(policy)
    buffers = {name: torch.empty_like(t) for name, t in adapter.items()}
    engines = {
        push: VLLMEngine(path, EngineSettings(dtype="float32", max_model_len=256, lora=settings[push]))
        for push in PUSHES
    }
    timings = {
        push: {key: [] for key in ("prepare_s", "write_s", "pause_s", "push_s", "first_token_s", "bytes")}
        for push in PUSHES
    }
    copies = []
    try:
        for engine in engines.values():
            engine.start()
        for round_ in range(warmup + repeats):
            with torch.no_grad():  # a new version: every adapter factor moves
                for name, parameter in policy.named_parameters():
                    if ".lora_" in name:
                        parameter.add_(torch.randn_like(parameter) * 1e-3)
            for push in PUSHES if round_ % 2 == 0 else PUSHES[::-1]:
                started = time.perf_counter()
                weights = engine_weights(policy, settings[push])
                prepared = time.perf_counter()
                pushed = engines[push].push_weights(weights, version=round_ + 1)
                served = time.perf_counter()
                engine = engines[push]
                turn = engine.run(engine.generate([1], max_tokens=1, temperature=1.0, ignore_eos=True), timeout_s=120)
                assert turn.versions == [round_ + 1]
                if round_ >= warmup:
                    row = timings[push]
                    row["prepare_s"].append(prepared - started)
                    row["push_s"].append(served - started)
                    row["first_token_s"].append(time.perf_counter() - served)
                    for key in ("write_s", "pause_s", "bytes"):
                        row[key].append(pushed[key])
            sources = list(adapter_weights(policy).values())
            started = time.perf_counter()
            torch._foreach_copy_(list(buffers.values()), sources)
            if round_ >= warmup:
                copies.append(time.perf_counter() - started)
    finally:
        for engine in engines.values():
            engine.shutdown()
    result = {push: {key: statistics.median(values) for key, values in timings[push].items()} for push in PUSHES}
    result["copy_s"] = statistics.median(copies)
    result["adapter_bytes"] = nbytes(adapter)
    result["model_bytes"] = nbytes({n: p for n, p in policy.named_parameters() if ".lora_" not in n})
    result["merged_over_adapter"] = statistics.median(
        m / a for m, a in zip(timings["merged"]["push_s"], timings["adapter"]["push_s"])
    )
    return result


def measure_steps(path: str, rank: int, repeats: int, warmup: int) -> dict:
    """Seconds per training step: the adapter (rank `rank`) against the last 2 layers trained."""
    torch.manual_seed(0)
    lora = add_adapter(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), LoRASettings(rank=rank))
    last_layers = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    freeze_all_but_last_layers(last_layers, 2)
    models = {"lora": lora, "last 2 layers": last_layers}
    optimizers = {
        name: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-5) for name, m in models.items()
    }
    input_ids = torch.randint(3, min(lora.config.vocab_size, 1000), (8, 128))
    seconds: dict[str, list[float]] = {name: [] for name in models}
    for round_ in range(warmup + repeats):
        for name in list(models) if round_ % 2 == 0 else list(models)[::-1]:
            started = time.perf_counter()
            loss = models[name](input_ids=input_ids, labels=input_ids).loss
            loss.backward()
            optimizers[name].step()
            optimizers[name].zero_grad(set_to_none=True)
            if round_ >= warmup:
                seconds[name].append(time.perf_counter() - started)
    trainable = {name: sum(p.numel() for p in m.parameters() if p.requires_grad) for name, m in models.items()}
    return {name: (statistics.median(values), trainable[name]) for name, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="the 0.3M tiny policy instead of SmolLM2-135M")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    name, path = (
        ("tiny 0.3M", resolve_model_path(None)) if args.tiny else ("SmolLM2-135M", resolve_model_path("smollm2_135m"))
    )
    print(
        f"{name}, rank {args.rank}, torch {torch.__version__}, {torch.get_num_threads()} threads, repeats {args.repeats}, "
        f"warm-up {args.warmup}, load {os.getloadavg()[0]:.2f}"
    )
    pushes = measure_pushes(str(path), args.rank, args.repeats, args.warmup)
    print(
        f"adapter {pushes['adapter_bytes'] / 1e6:.2f} MB, model {pushes['model_bytes'] / 1e6:.1f} MB; plain copy of the adapter "
        f"{pushes['copy_s'] * 1e3:.2f} ms"
    )
    print(
        "| push | MB sent | prepare s | write s | engine pause s | push s (trainer waits) | push / adapter copy | first token after s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for push in PUSHES:
        row = pushes[push]
        print(
            f"| {push} | {row['bytes'] / 1e6:.2f} | {row['prepare_s']:.3f} | {row['write_s']:.3f} | {row['pause_s']:.3f} | "
            f"{row['push_s']:.3f} | {row['push_s'] / pushes['copy_s']:.0f}x | {row['first_token_s']:.3f} |"
        )
    print(f"merged / adapter push (per round, median): {pushes['merged_over_adapter']:.1f}x")
    steps = measure_steps(str(path), args.rank, args.repeats, args.warmup)
    print("| trained | parameters | step s (8 x 128 tokens) |")
    print("|---|---:|---:|")
    for trained, (seconds, count) in steps.items():
        print(f"| {trained} | {count / 1e6:.2f}M | {seconds:.3f} |")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
