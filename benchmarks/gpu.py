"""GPU cost of the exact and the approximate reference at the paper's scale (torch only, no vLLM).

For a lent GPU machine. A module with the parameter shapes of a 4B-parameter Qwen3 model in bf16
(8.04 GB, the paper's Table 6 snapshot size) is made on the GPU without any forward pass, then:

1. Snapshot save: ``SnapshotStore.save`` (the store ``SnapshotRetention`` uses), GPU -> pinned host,
   against a raw copy of the same bytes as one flat tensor into pinned memory, measured in the same
   run, and against the paper's 8.04 GB saved in 3.95 s (Table 6).
2. Snapshot load: the host snapshot back onto the GPU the way ``SnapshotRetention`` materialises a
   version, against a raw flat host -> GPU copy, and against the paper's 7.11 s load.
3. EWMA update: ``EWMAReference.update`` (one fused ``_foreach_lerp_``) against a raw
   device-to-device ``_foreach_copy_`` of the same tensors.

Every timing is the median of ``--repeats`` rounds after ``--warmup`` rounds; each ratio divides two
numbers measured side by side in this run. ``--quick`` keeps 4 of the 36 layers (about 1.3 GB).

Usage::

    python benchmarks/gpu.py            # ~8 GB on the GPU, ~24 GB pinned host memory, < 5 minutes
    python benchmarks/gpu.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from asyncrl_callbacks.ewma import EWMAReference
from asyncrl_callbacks.snapshot import SnapshotRetention
from torch import nn

_GB = 1e9
# Table 6 of the paper: Qwen3-4B snapshot size, save time per step and load time.
PAPER_SNAPSHOT_GB, PAPER_SAVE_S, PAPER_LOAD_S = 8.04, 3.95, 7.11


class Qwen3ShapedWeights(nn.Module):
    """Parameters shaped like Qwen3-4B (tied embeddings), uninitialised: only their bytes matter here."""

    def __init__(self, layers: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        hidden, intermediate, vocab, q_width, kv_width, head_dim = 2560, 9728, 151936, 32 * 128, 8 * 128, 128

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype).normal_(std=0.02))

        self.embed_tokens = param(vocab, hidden)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            layer = nn.Module()
            for name, shape in {
                "q_proj": (q_width, hidden),
                "k_proj": (kv_width, hidden),
                "v_proj": (kv_width, hidden),
                "o_proj": (hidden, q_width),
                "gate_proj": (intermediate, hidden),
                "up_proj": (intermediate, hidden),
                "down_proj": (hidden, intermediate),
                "input_layernorm": (hidden,),
                "post_attention_layernorm": (hidden,),
                "q_norm": (head_dim,),
                "k_norm": (head_dim,),
            }.items():
                layer.register_parameter(name, param(*shape))
            self.layers.append(layer)
        self.norm = param(hidden)


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int) -> float:
    times = []
    for round_index in range(warmup + repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if round_index >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def raw_host_copies(nbytes: int, device: torch.device, repeats: int, warmup: int) -> tuple[float, float]:
    """Seconds to copy ``nbytes`` as one flat tensor GPU -> pinned host, and back."""
    flat_gpu = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    flat_host = torch.empty(nbytes // 2, dtype=torch.bfloat16, pin_memory=True)
    to_host = median_seconds(lambda: flat_host.copy_(flat_gpu, non_blocking=True), repeats, warmup)
    to_device = median_seconds(lambda: flat_gpu.copy_(flat_host, non_blocking=True), repeats, warmup)
    return to_host, to_device


def row(label: str, seconds: float, nbytes: int) -> str:
    return f"{label:<52} {seconds * 1e3:10.1f} ms {nbytes / _GB / seconds:9.2f} GB/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 layers instead of 36")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA GPU (torch.cuda.is_available() is False)")
    device = torch.device("cuda")
    model = Qwen3ShapedWeights(4 if args.quick else 36, device, torch.bfloat16)
    params = list(model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in params)
    print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    print(
        f"weights: {sum(p.numel() for p in params) / 1e9:.3f}B parameters, {nbytes / _GB:.2f} GB bf16, {len(params)} tensors"
    )
    print(f"timings: median of {args.repeats} rounds after {args.warmup} warm-up rounds\n")

    # --- snapshot save / load, through the library, next to raw copies of the same bytes
    retention = SnapshotRetention(max_staleness=1)
    version = iter(range(10**6))
    cold_save_s = median_seconds(lambda: retention.save_version(next(version), model), repeats=1, warmup=0)
    save_s = median_seconds(lambda: retention.save_version(next(version), model), args.repeats, args.warmup)
    latest = retention.latest_version
    load_s = median_seconds(lambda: retention._materialise(latest, model), args.repeats, args.warmup)

    raw_d2h_s, raw_h2d_s = raw_host_copies(nbytes, device, args.repeats, args.warmup)

    # --- EWMA update next to a raw device-to-device copy of the same tensors
    ewma = EWMAReference(beta=0.9)
    ewma.attach(model)
    destination = [p.detach().clone() for p in params]
    sources = [p.detach() for p in params]
    ewma_s = median_seconds(ewma.update, args.repeats, args.warmup)
    copy_s = median_seconds(lambda: torch._foreach_copy_(destination, sources), args.repeats, args.warmup)

    print(row("first snapshot save (allocates its pinned memory)", cold_save_s, nbytes))
    print(row("snapshot save (SnapshotStore.save, GPU -> pinned)", save_s, nbytes))
    print(row("raw flat copy GPU -> pinned host", raw_d2h_s, nbytes))
    print(row("snapshot load (materialise, pinned -> GPU)", load_s, nbytes))
    print(row("raw flat copy pinned host -> GPU", raw_h2d_s, nbytes))
    print(row("EWMA update (_foreach_lerp_, reads 2x, writes 1x)", ewma_s, nbytes))
    print(row("raw device copy (_foreach_copy_, reads 1x, writes 1x)", copy_s, nbytes))
    paper_save_gbps, paper_load_gbps = PAPER_SNAPSHOT_GB / PAPER_SAVE_S, PAPER_SNAPSHOT_GB / PAPER_LOAD_S
    print()
    print(f"snapshot save / raw copy: {save_s / raw_d2h_s:.2f}x the time")
    print(f"snapshot load / raw copy: {load_s / raw_h2d_s:.2f}x the time")
    print(
        f"snapshot save bandwidth / paper's (8.04 GB in 3.95 s = {paper_save_gbps:.2f} GB/s): {nbytes / save_s / _GB / paper_save_gbps:.1f}x"
    )
    print(
        f"snapshot load bandwidth / paper's (8.04 GB in 7.11 s = {paper_load_gbps:.2f} GB/s): {nbytes / load_s / _GB / paper_load_gbps:.1f}x"
    )
    print(f"EWMA update / raw device copy: {ewma_s / copy_s:.2f}x the time (lerp moves 1.5x the bytes of a copy)")


if __name__ == "__main__":
    main()
