"""The weight push (pause, load, relabel, resume) by its three CPU routes, against a plain copy of
the same bytes.

Each round writes the tensors in place first, as an optimizer does: a push sends only what was written
since the engine's last one (`changed_tensors.py`). A last set of rows writes only SmolLM2's last 2
layers, as `model.train_last_layers=2` does, so each push sends those alone. The plain copy copies what
a push sends (the written tensors), and `pause / copy` is the engine's pause against it.

For each model, three real vLLM engines (fp32) are started, one per route (`rollout.weight_transfer`):
`file` (a safetensors file in /dev/shm, reloaded by the engine), `staged` (the same file, read, fused
and packed inside the engine while it generates, then swapped in: `staged_weights.py`) and `gloo`
(vLLM's weight-transfer API over a gloo group). Each round pushes the trainer's state dict to each
with `VLLMEngine.push_weights` (the order rotates) and makes a plain copy of the same tensors into
preallocated buffers (`torch._foreach_copy_`), after warm-up rounds. Printed per model and route:
the push split into what happens while the engine still generates (the file written; staged, also
prepared) and the engine's pause, push / copy, the pause against the target of 2x a copy, and each
route's push time against the file route's. The 0.3M tiny policy shows the push's fixed cost. The last
line is the staged route's pause at 25M.

    .venv/bin/python benchmarks/bench_weight_push.py            # 0.3M, 25M and SmolLM2-135M (~3 min on 2 cores)
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
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine

TARGET = 2.0
ROUTES = ("file", "staged", "gloo")
# ~25M parameters with the tiny policy's architecture and tokenizer (3.1M per layer).
MEDIUM = TinyPolicyConfig(
    hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64, intermediate_size=1536
)


def measure(name: str, path, repeats: int, warmup: int, written_layers: int | None = None) -> dict:
    """`written_layers`: each round writes only the last this many decoder layers (as a run with
    `model.train_last_layers` does), so a push sends only them; None writes every tensor."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    state = model.state_dict()
    first_written = model.config.num_hidden_layers - (written_layers or model.config.num_hidden_layers)
    written = [t for n, t in state.items() if written_layers is None or _layer(n) >= first_written]
    tensors = list({t.data_ptr(): t for t in written}.values())  # what a push sends; tied tensors once
    buffers = [torch.empty_like(t) for t in tensors]
    engines = {
        route: VLLMEngine(path, EngineSettings(dtype="float32", max_model_len=256, weight_transfer=route))
        for route in ROUTES
    }
    timings: dict[str, dict[str, list[float]]] = {
        route: {"write_s": [], "pause_s": [], "push_s": [], "bytes": []} for route in ROUTES
    }
    copies = []
    try:
        for engine in engines.values():
            engine.start()
        for round_ in range(warmup + repeats):
            with torch.no_grad():  # a new version: the written tensors change in place, as under an optimizer
                torch._foreach_add_(written, 1e-6)
            for route in ROUTES[round_ % len(ROUTES) :] + ROUTES[: round_ % len(ROUTES)]:
                started = time.perf_counter()
                pushed = engines[route].push_weights(state, version=round_ + 1)
                if round_ >= warmup:
                    timings[route]["push_s"].append(time.perf_counter() - started)
                    timings[route]["write_s"].append(pushed.write_s)
                    timings[route]["pause_s"].append(pushed.pause_s)
                    timings[route]["bytes"].append(pushed.bytes)
            started = time.perf_counter()
            torch._foreach_copy_(buffers, tensors)
            if round_ >= warmup:
                copies.append(time.perf_counter() - started)
    finally:
        for engine in engines.values():
            engine.shutdown()
    params = sum(p.numel() for p in model.parameters())
    rows = {
        route: {
            "model": name if written_layers is None else f"{name}, last {written_layers} layers written",
            "route": route,
            "params_m": params / 1e6,
            "gb": statistics.median(timings[route]["bytes"]) / 1e9,
            **{key: statistics.median(values) for key, values in timings[route].items()},
            "copy_s": statistics.median(copies),
            "ratio": statistics.median(p / c for p, c in zip(timings[route]["push_s"], copies)),
            "pause_ratio": statistics.median(p / c for p, c in zip(timings[route]["pause_s"], copies)),
        }
        for route in ROUTES
    }
    for route in ROUTES[1:]:
        rows[route]["against_file"] = statistics.median(
            r / f for r, f in zip(timings[route]["push_s"], timings["file"]["push_s"])
        )
    return list(rows.values())


def _layer(name: str) -> int:
    """The decoder layer a tensor belongs to ("model.layers.3.mlp..." -> 3), -1 for the others."""
    parts = name.split(".")
    return int(parts[2]) if parts[:2] == ["model", "layers"] else -1


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
    rows = [row for name, path in models for row in measure(name, path, repeats, args.warmup)]
    if not args.quick:  # what `model.train_last_layers=2` pushes after the first version
        rows += measure("SmolLM2-135M", resolve_model_path("smollm2_135m"), repeats, args.warmup, written_layers=2)
    print(
        "| model | route | params | GB pushed | while generating s | engine pause s | push s | plain copy s | push / copy | pause / copy | pause target | push / file's |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---:|")
    for row in rows:
        verdict = "met" if row["pause_ratio"] <= TARGET else "missed"
        against = f"{row['against_file']:.2f}" if "against_file" in row else ""
        print(
            f"| {row['model']} | {row['route']} | {row['params_m']:.1f}M | {row['gb']:.3f} | {row['write_s']:.3f} | {row['pause_s']:.3f} | "
            f"{row['push_s']:.3f} | {row['copy_s']:.4f} | {row['ratio']:.0f}x | {row['pause_ratio']:.1f}x | {TARGET:g}x {verdict} | {against} |"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    at_25m = {row["route"]: row for row in rows if row["model"] == "tiny 25M"}
    print(
        f"file route, engine pause / copy of loaded bytes at 25M: {at_25m['file']['pause_ratio']:.1f}x; the staged route's:"
    )
    print(f"engine pause / copy of loaded bytes at 25M: {at_25m['staged']['pause_ratio']:.1f}x")


if __name__ == "__main__":
    main()
