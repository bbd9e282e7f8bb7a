"""A full fine-tune's push with and without `rollout.push_changed_elements`, side by side.

A model is trained with AdamW on next-token loss over random tokens (the update's size is what matters,
not the task); after each optimizer step its state dict is pushed to two real vLLM engines on the staged
route (`rollout.weight_transfer=staged`), one sending whole tensors, the other only the elements whose
bits changed in the engine's dtype (`lit_asyncrl/rollout/weights/changed_elements.py`), in alternating order.
After the pushes a short turn from each engine is scored by the trainer at the new version: the largest
|mu - log pi| shows that both engines serve the trained weights. Printed per learning rate and route:
medians over the steps after the first (AdamW's first step is larger than its steady state) of the bytes
sent, the time the engine still generated (the file written and staged), the engine's pause and the
whole push, and the changed-elements push against the whole one.

    .venv/bin/python benchmarks/bench_changed_elements.py               # SmolLM2-135M, bf16 engines (~4 min on 2 cores)
    .venv/bin/python benchmarks/bench_changed_elements.py --tiny        # the 0.3M tiny policy
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
from lit_asyncrl.scoring import token_logprobs

ROUTES = {"whole tensors": False, "changed elements": True}


def measure(model_path: str, dtype: str, lr: float, steps: int, batch: int, length: int) -> list[dict]:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    engines = {
        route: VLLMEngine(
            model_path,
            EngineSettings(dtype=dtype, max_model_len=256, weight_transfer="staged", push_changed_elements=elements),
        )
        for route, elements in ROUTES.items()
    }
    timings = {route: {"bytes": [], "write_s": [], "pause_s": [], "push_s": []} for route in ROUTES}
    worst = dict.fromkeys(ROUTES, 0.0)
    try:
        for engine in engines.values():
            engine.start()
            engine.push_weights(model.state_dict(), version=0)  # the first push is whole on both
        for step in range(1, steps + 1):
            model.train()
            ids = torch.randint(0, model.config.vocab_size, (batch, length))
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            order = list(ROUTES) if step % 2 else list(ROUTES)[::-1]
            for route in order:
                started = time.perf_counter()
                pushed = engines[route].push_weights(model.state_dict(), version=step)
                elapsed = time.perf_counter() - started
                if step > 1:
                    for key in ("bytes", "write_s", "pause_s"):
                        timings[route][key].append(getattr(pushed, key))
                    timings[route]["push_s"].append(elapsed)
            model.eval()
            for route, engine in engines.items():
                turn = engine.run(
                    engine.generate([1, 2, 3], max_tokens=16, temperature=1.0, ignore_eos=True), timeout_s=120
                )
                ids = torch.tensor([[1, 2, 3] + turn.token_ids])
                with torch.no_grad():
                    pi = token_logprobs(model, ids, torch.ones_like(ids), 1.0)[0, 3:]
                worst[route] = max(worst[route], (pi - torch.tensor(turn.logprobs)).abs().max().item())
    finally:
        for engine in engines.values():
            engine.shutdown()
    whole = statistics.median(timings["whole tensors"]["push_s"])
    return [
        {
            "lr": lr,
            "route": route,
            **{key: statistics.median(values) for key, values in timings[route].items()},
            "against_whole": statistics.median(timings[route]["push_s"]) / whole,
            "worst": worst[route],
        }
        for route in ROUTES
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="the 0.3M tiny policy instead of SmolLM2-135M")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    path = resolve_model_path(None if args.tiny else "smollm2_135m")
    rates = (2e-6, 6e-5) if args.tiny else (1e-6, 1e-5)
    print(
        f"{'tiny 0.3M' if args.tiny else 'SmolLM2-135M'}, {args.dtype} engines, {args.steps} steps, load {os.getloadavg()[0]:.2f}"
    )
    print(
        "| lr | push | MB sent | while generating s | engine pause s | push s | push / whole's | max abs(mu - log pi) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for lr in rates:
        for row in measure(path, args.dtype, lr, args.steps, batch=2, length=64):
            print(
                f"| {lr:.0e} | {row['route']} | {row['bytes'] / 1e6:.2f} | {row['write_s']:.3f} | {row['pause_s']:.3f} | "
                f"{row['push_s']:.3f} | {row['against_whole']:.2f} | {row['worst']:.2e} |"
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
