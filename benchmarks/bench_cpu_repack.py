"""Where a CPU engine's weight-push pause goes: vLLM's oneDNN re-pack of each linear layer against a copy.

vLLM's CPU build runs each linear layer through a oneDNN handle made from the weight
(`dispatch_cpu_unquantized_gemm` in vllm/model_executor/layers/utils.py): after a reload every linear layer
is packed again. This times, for the linear layers of a model as vLLM fuses them (q/k/v as one, gate/up as
one, the head), that packing (`ops.create_onednn_mm`, what the reload calls) against a plain copy of the
same weights into preallocated tensors (what loading alone needs), in one run, medians of `--repeats`
rounds after `--warmup`. A staged push would make the new handles while the engine still generates and
pause only to swap them; the packing's share of the pause is what it could take off.

    .venv/bin/python benchmarks/bench_cpu_repack.py    # the tiny policy's 25M variant and SmolLM2-135M, fp32
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from vllm import _custom_ops as ops

from lit_asyncrl.models import resolve_model_path


def linear_shapes(config) -> list[tuple[int, int]]:
    """(out, in) of every linear layer vLLM makes for a Llama-style config, fused as vLLM fuses them."""
    hidden, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    per_layer = [(q + 2 * kv, hidden), (hidden, q), (2 * inter, hidden), (hidden, inter)]
    return per_layer * layers + [(config.vocab_size, hidden)]


def median_seconds(work, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        work()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from transformers import AutoConfig

    from lit_asyncrl.models import TinyPolicyConfig, build_tiny_policy

    medium = TinyPolicyConfig(
        hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64, intermediate_size=1536
    )
    models = [
        ("tiny 25M", AutoConfig.from_pretrained(build_tiny_policy(medium))),
        ("SmolLM2-135M", AutoConfig.from_pretrained(resolve_model_path("smollm2_135m"))),
    ]
    print(f"{'model':<14} {'linear MB':>10} {'re-pack s':>10} {'copy s':>8} {'re-pack / copy':>15}")
    for label, config in models:
        weights = [torch.randn(shape) for shape in linear_shapes(config)]
        targets = [torch.empty_like(weight) for weight in weights]
        repack = median_seconds(
            lambda weights=weights: [ops.create_onednn_mm(w.t(), 32) for w in weights], args.warmup, args.repeats
        )
        copy = median_seconds(
            lambda weights=weights, targets=targets: torch._foreach_copy_(targets, weights), args.warmup, args.repeats
        )
        megabytes = sum(weight.numel() * weight.element_size() for weight in weights) / 1e6
        print(f"{label:<14} {megabytes:>10.1f} {repack:>10.4f} {copy:>8.4f} {repack / copy:>14.1f}x")


if __name__ == "__main__":
    main()
