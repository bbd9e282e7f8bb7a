"""Cost of one EWMAReference update against a plain ``torch._foreach_copy_`` of the same parameters.

The parameters are shaped like a small decoder-only transformer (~25M by default). The two operations are timed
in the same run, interleaved (the order alternates every repeat) so that drift in machine load hits both alike;
the script prints the median of each and their ratio (target: at most 1.3x).

A copy reads the weights once and writes once; the update (``Z <- beta Z + 1`` then one fused
``torch._foreach_lerp_``) reads the weights and the average and writes the average. Where a write costs a read
for ownership (CPU caches), both move three tensors' worth of memory; where it does not (GPU), the floor is 1.5x.

    python benchmarks/bench_ewma.py                      # CPU
    python benchmarks/bench_ewma.py --device cuda --repeats 50
"""

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from asyncrl_callbacks import EWMAReference
from torch import nn


def transformer_like(vocab: int, d_model: int, d_ff: int, layers: int) -> nn.ParameterDict:
    """Parameters with the shapes of a Llama/Qwen-style decoder (tied embedding, no biases)."""
    shapes = {"embed": (vocab, d_model), "final_norm": (d_model,)}
    for i in range(layers):
        for name in ("q", "k", "v", "o"):
            shapes[f"l{i}_{name}"] = (d_model, d_model)
        shapes |= {f"l{i}_gate": (d_ff, d_model), f"l{i}_up": (d_ff, d_model), f"l{i}_down": (d_model, d_ff)}
        shapes |= {f"l{i}_norm1": (d_model,), f"l{i}_norm2": (d_model,)}
    return nn.ParameterDict({name: nn.Parameter(torch.randn(shape) * 0.02) for name, shape in shapes.items()})


def timed(fn: Callable[[], None], device: torch.device) -> float:
    """Seconds for one call, with the device drained before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--d-ff", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()

    device = torch.device(args.device)
    module = transformer_like(args.vocab, args.d_model, args.d_ff, args.layers).to(device, getattr(torch, args.dtype))
    params = list(module.parameters())
    copies = [p.detach().clone() for p in params]
    ewma = EWMAReference(beta=0.75)
    ewma.attach(module)

    def copy() -> None:
        torch._foreach_copy_(copies, params)

    ops = {"foreach_copy": copy, "ewma_update": ewma.update}
    for _ in range(args.warmup):
        for fn in ops.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in ops}
    for i in range(args.repeats):
        for name in list(ops)[:: 1 if i % 2 == 0 else -1]:
            times[name].append(timed(ops[name], device))

    n_params = sum(p.numel() for p in params)
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"device={device} dtype={args.dtype} params={n_params / 1e6:.1f}M tensors={len(params)} "
        f"repeats={args.repeats} threads={torch.get_num_threads()}"
    )
    for name, median in medians.items():
        print(f"{name:>13}: median {median * 1e3:8.3f} ms  (min {min(times[name]) * 1e3:8.3f} ms)")
    ratio = medians["ewma_update"] / medians["foreach_copy"]
    best = min(times["ewma_update"]) / min(times["foreach_copy"])
    print(f"ratio ewma_update / foreach_copy: median {ratio:.2f}x, min {best:.2f}x (target <= 1.3x)")


if __name__ == "__main__":
    main()
