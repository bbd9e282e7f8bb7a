"""Time every loss strategy (forward + backward, metrics included) against a minimal PPO-clip baseline.

    .venv/bin/python benchmarks/bench_losses.py              # 4M tokens: B=1024, T=4096
    .venv/bin/python benchmarks/bench_losses.py --batch 64 --length 512 --repeats 3

The baseline is the textbook elementwise PPO-clip (exp, min, clamp, masked mean) written inline.
Strategies and baseline run interleaved in every repeat, after ``--warmup`` untimed rounds, so
machine noise hits them alike; the table reports the median over repeats of (strategy time /
baseline time of the same repeat), for wall time and for this process's CPU time (steadier when
other processes compete for the cores), against the target of at most ``--target`` (2x).

The inputs keep the batch's M2 = mean (log r)^2 below M2PO's default bound (0.04), so ``m2po`` only
checks it; the row ``m2po (tau=0.002)`` uses a bound the batch exceeds, so that the selection runs
(sorting the tokens that may be dropped) and drops a few percent of them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from lit_asyncrl.losses import LossInputs, available_losses, get_loss


def make_inputs(batch: int, length: int, seed: int = 0) -> LossInputs:
    """Realistic magnitudes: pi and pi_ref within a few percent of mu, 90 % policy tokens, gaps 0..4."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, length)
    behavior = -3.0 * torch.rand(shape, generator=generator)  # [B, T]
    return LossInputs(
        logprobs=(behavior + 0.05 * torch.randn(shape, generator=generator)).requires_grad_(),
        behavior_logprobs=behavior,
        advantages=torch.randn(shape, generator=generator),
        loss_mask=torch.rand(shape, generator=generator) < 0.9,
        ref_logprobs=behavior + 0.02 * torch.randn(shape, generator=generator),
        version_gap=torch.randint(0, 5, shape, generator=generator),
    )


# extra rows: label -> (registered name, constructor arguments)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {"m2po (tau=0.002)": ("m2po", {"second_moment_bound": 0.002})}


def baseline_ppo_clip(inputs: LossInputs) -> torch.Tensor:
    """Minimal elementwise PPO-clip on pi/mu: the reference cost."""
    ratio = torch.exp(inputs.logprobs - inputs.behavior_logprobs)
    surrogate = torch.minimum(ratio * inputs.advantages, ratio.clamp(0.8, 1.2) * inputs.advantages)
    mask = inputs.loss_mask.to(ratio.dtype)
    return -(surrogate * mask).sum() / mask.sum()


def time_once(step: Callable[[], torch.Tensor], inputs: LossInputs) -> tuple[float, float]:
    """Wall and process-CPU seconds of one forward + backward."""
    inputs.logprobs.grad = None
    wall, cpu = time.perf_counter(), time.process_time()
    step().backward()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds of every step before the repeats")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--target", type=float, default=2.0, help="the ratio every strategy should stay within")
    parser.add_argument("--only", nargs="*", default=None, help="strategy names (default: all, and the variants)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    inputs = make_inputs(args.batch, args.length)
    names = args.only or available_losses()
    strategies = {name: get_loss(name) for name in names}
    if args.only is None:
        strategies.update({label: get_loss(name, **kwargs) for label, (name, kwargs) in VARIANTS.items()})
    steps: dict[str, Callable[[], torch.Tensor]] = {"baseline_ppo_clip": lambda: baseline_ppo_clip(inputs)}
    for name, strategy in strategies.items():
        steps[name] = lambda strategy=strategy: strategy(inputs).loss

    load_before = os.getloadavg()[0]
    for _ in range(args.warmup):  # allocator, first-call overheads
        for step in steps.values():
            time_once(step, inputs)
    seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for _ in range(args.repeats):
        for name, step in steps.items():
            seconds[name].append(time_once(step, inputs))

    baseline = seconds["baseline_ppo_clip"]
    tokens = args.batch * args.length
    print(f"tokens={tokens} (B={args.batch}, T={args.length}), repeats={args.repeats}, warmup={args.warmup}, "
          f"threads={torch.get_num_threads()}, torch={torch.__version__}, "
          f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")  # fmt: skip
    for label, strategy in strategies.items():
        if label in VARIANTS:
            dropped = strategy(inputs).metrics["ppo_clip_ratio"]
            print(f"{label}: drops {dropped:.2%} of the policy tokens")
    print(f"| {'strategy':<26} | {'wall_s':>7} | {'wall ratio':>10} | {'cpu_s':>7} | {'cpu ratio':>9} | target |")
    print(f"|{'-' * 28}|{'-' * 8}:|{'-' * 11}:|{'-' * 8}:|{'-' * 10}:|:------:|")
    ratios: dict[str, tuple[float, float]] = {}
    for name, times in seconds.items():
        wall_ratio = statistics.median(t[0] / b[0] for t, b in zip(times, baseline))
        cpu_ratio = statistics.median(t[1] / b[1] for t, b in zip(times, baseline))
        wall = statistics.median(t[0] for t in times)
        cpu = statistics.median(t[1] for t in times)
        verdict = "ok" if wall_ratio <= args.target else "OVER"
        print(f"| {name:<26} | {wall:>7.3f} | {wall_ratio:>10.2f} | {cpu:>7.3f} | {cpu_ratio:>9.2f} | {verdict:^6} |")
        if name != "baseline_ppo_clip":
            ratios[name] = (wall_ratio, cpu_ratio)
    within = [name for name, (wall_ratio, _) in ratios.items() if wall_ratio <= args.target]
    worst_wall = max(ratios, key=lambda name: ratios[name][0])
    worst_cpu = max(ratios, key=lambda name: ratios[name][1])
    print(f"summary: {len(within)}/{len(ratios)} within {args.target:g}x of the baseline (wall); "
          f"wall ratios {min(r[0] for r in ratios.values()):.2f}-{ratios[worst_wall][0]:.2f} (max {worst_wall}), "
          f"cpu ratios {min(r[1] for r in ratios.values()):.2f}-{ratios[worst_cpu][1]:.2f} (max {worst_cpu})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
