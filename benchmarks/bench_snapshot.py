"""Cost of snapshot retention on a ~25M-parameter transformer (paper appendix G.1, Table 6).

Times, through ``SnapshotRetention`` itself: saving a version (device -> host copy, or a host clone on
CPU), loading it back (host -> device), restoring the parameter dict, one historical forward through
``functional_call`` next to a plain forward of the live model, and the copy bandwidths.

Usage::

    python benchmarks/bench_snapshot.py                    # CPU
    python benchmarks/bench_snapshot.py --device cuda      # pinned host memory, GPU <-> host bandwidth
    python benchmarks/bench_snapshot.py --storage-dtype bf16
"""

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from asyncrl_callbacks.snapshot import SnapshotRetention
from torch import Tensor, nn


class TinyTransformer(nn.Module):
    """Token embedding, a stack of encoder layers, and an untied head."""

    def __init__(self, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, nhead=8, dim_feedforward=4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.head(self.encoder(self.embed(input_ids)))  # [B, T, V]


def token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    return logits.float().log_softmax(-1).gather(-1, input_ids[..., None]).squeeze(-1)  # [B, T]


def median_seconds(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_metric(callback: SnapshotRetention, key: str, fn: Callable[[], object], repeats: int) -> float:
    values = []
    for _ in range(repeats):
        callback.metrics[key] = 0.0
        fn()
        values.append(callback.metrics[key])
    return statistics.median(values)


def run(args: argparse.Namespace) -> dict[str, float]:
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = TinyTransformer(args.vocab, args.width, args.layers).to(device).eval()
    storage = {"fp32": None, "bf16": torch.bfloat16}[args.storage_dtype]
    callback = SnapshotRetention(max_staleness=args.repeats + 2, storage_dtype=storage)
    input_ids = torch.randint(0, args.vocab, (args.batch, args.seq), device=device)
    score = lambda forward, rows: token_logprobs(forward(input_ids[rows]), input_ids[rows])  # noqa: E731
    versions = iter(range(1, 1000))

    callback.save_version(0, model)  # warm-up: first allocation of host (pinned) memory
    save = lambda: callback.save_version(next(versions), model)  # noqa: E731
    save_s = median_metric(callback, "snapshot/save_s", save, args.repeats)

    # All tokens from version 0 while the live model is newer: one historical shard over every row.
    token_versions = torch.zeros_like(input_ids)
    mask = torch.ones_like(input_ids, dtype=torch.bool)
    historical = lambda: callback.historical_logprobs(token_versions, mask, score)  # noqa: E731
    historical()  # warm-up
    stage = {}
    for key in ("snapshot/load_s", "snapshot/restore_s", "snapshot/historical_forward_s", "snapshot/stage_s"):
        stage[key] = median_metric(callback, key, historical, args.repeats)
    with torch.no_grad():
        plain_s = median_seconds(lambda: score(model, torch.arange(args.batch, device=device)), args.repeats, device)

    size_gb = callback.metrics["snapshot/size_gb"]
    params = sum(p.numel() for p in model.parameters())
    return {
        "parameters (M)": params / 1e6,
        "snapshot size (GB)": size_gb,
        "save (s)": save_s,
        "save bandwidth (GB/s)": size_gb / save_s,  # stored bytes per second
        "load (s)": stage["snapshot/load_s"],
        "load bandwidth (GB/s)": size_gb / stage["snapshot/load_s"] if stage["snapshot/load_s"] else float("nan"),
        "restore (s)": stage["snapshot/restore_s"],
        "plain forward (s)": plain_s,
        "historical forward (s)": stage["snapshot/historical_forward_s"],
        "historical stage (s)": stage["snapshot/stage_s"],
        "stage / plain forward": stage["snapshot/stage_s"] / plain_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    parser.add_argument("--storage-dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--vocab", type=int, default=6144)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = run(args)
    print(f"snapshot benchmark: device={args.device} storage={args.storage_dtype} batch={args.batch}x{args.seq}")
    print(f"| {'metric':<24} | {'value':>10} |\n|{'-' * 26}|{'-' * 12}|")
    for name, value in results.items():
        print(f"| {name:<24} | {value:>10.4f} |")


if __name__ == "__main__":
    main()
