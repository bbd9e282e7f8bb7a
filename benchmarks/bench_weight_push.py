"""The weight push (pause, load, relabel, resume) against a plain copy of the same bytes.

For each model, one real vLLM engine (fp32) is started and the trainer's state dict is pushed
with `VLLMEngine.push_weights`, interleaved with a plain copy of the same tensors into
preallocated buffers (`torch._foreach_copy_`), after warm-up rounds. Printed per model: the push
split into its trainer-side write (safetensors into /dev/shm) and the engine's pause (pause,
layer-wise reload, relabel, resume), the copy, and push / copy against the target of 2x. The
0.3M tiny policy shows the push's fixed cost.

    .venv/bin/python benchmarks/bench_weight_push.py            # 0.3M, 25M and SmolLM2-135M (~4 min on 2 cores)
    .venv/bin/python benchmarks/bench_weight_push.py --quick    # 0.3M and 25M, fewer repeats
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.models import TinyPolicyConfig, build_tiny_policy, resolve_model_path
from lit_asyncrl.rollout.engine import EngineConfig, VLLMEngine

TARGET = 2.0
# ~25M parameters with the tiny policy's architecture and tokenizer (3.1M per layer).
MEDIUM = TinyPolicyConfig(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64, intermediate_size=1536)


def measure(name: str, path, repeats: int, warmup: int) -> dict:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    state = model.state_dict()
    tensors = list({id(t): t for t in state.values()}.values())  # tied tensors once
    buffers = [torch.empty_like(t) for t in tensors]
    size_gb = sum(t.numel() * t.element_size() for t in tensors) / 1e9
    engine = VLLMEngine(path, EngineConfig(dtype="float32", max_model_len=256))
    engine.start()
    writes, pauses, pushes, copies = [], [], [], []
    try:
        for round_ in range(warmup + repeats):
            started = time.perf_counter()
            timings = engine.push_weights(state, version=round_ + 1)
            push_s = time.perf_counter() - started
            started = time.perf_counter()
            torch._foreach_copy_(buffers, tensors)
            copy_s = time.perf_counter() - started
            if round_ >= warmup:
                writes.append(timings["write_s"])
                pauses.append(timings["pause_s"])
                pushes.append(push_s)
                copies.append(copy_s)
    finally:
        engine.shutdown()
    params = sum(p.numel() for p in model.parameters())
    return {
        "model": name,
        "params_m": params / 1e6,
        "gb": size_gb,
        "write_s": statistics.median(writes),
        "pause_s": statistics.median(pauses),
        "push_s": statistics.median(pushes),
        "copy_s": statistics.median(copies),
        "ratio": statistics.median(p / c for p, c in zip(pushes, copies)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="0.3M and 25M only, 3 repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 5)
    models = [("tiny 0.3M", build_tiny_policy()), ("tiny 25M", build_tiny_policy(MEDIUM))]
    if not args.quick:
        models.append(("SmolLM2-135M", resolve_model_path("smollm2_135m")))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, repeats {repeats}, warm-up {args.warmup}, load {os.getloadavg()[0]:.2f}"
    )
    rows = [measure(name, path, repeats, args.warmup) for name, path in models]
    print("| model | params | GB pushed | write s | engine pause s | push s | plain copy s | push / copy | target |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|:---:|")
    for row in rows:
        verdict = "ok" if row["ratio"] <= TARGET else "missed"
        print(
            f"| {row['model']} | {row['params_m']:.1f}M | {row['gb']:.3f} | {row['write_s']:.3f} | {row['pause_s']:.3f} | "
            f"{row['push_s']:.3f} | {row['copy_s']:.4f} | {row['ratio']:.0f}x | {TARGET:g}x {verdict} |"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
