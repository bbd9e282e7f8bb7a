"""Overhead of each pi_old route, measured side by side on the same run configuration.

Runs the Hydra entry once per route (same seed, model, task, batch and step count), then reads each
run's metrics.csv and prints, per route: median step time and its ratio to the route without a
reference, extra time per step, storage the route keeps (snapshots), and its switch or stall
latency (weight push pause, interruption stall, dedicated group wait). The paper's Table 3 in
miniature, on the tiny policy and 2 CPU cores.

    .venv/bin/python benchmarks/bench_reference_routes.py --steps 40
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from hydra_runs import median, run_steps

ROUTES = {
    "none (ppo_clip_train_infer)": "ppo_clip_train_infer",
    "async_recompute": "decoupled_async",
    "ewma": "ppo_ewma",
    "snapshot": "snapshot",
    "interrupt_sync": "interrupt_sync",
    "dedicated": "dedicated",
}
RUN = [
    "rollout.group_size=8",
    "rollout.groups_per_batch=8",
    "rollout.buffer_capacity=128",
    "rollout.max_concurrent_groups=8",
    "model.warm_start_steps=30",
]


def run_route(experiment: str, steps: int, out_dir: Path) -> list[dict[str, float]]:
    return run_steps(
        [f"experiment={experiment}", f"trainer.max_steps={steps}", "checkpoint_every=1000000", *RUN], out_dir
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the medians")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as root:
        for name, experiment in ROUTES.items():
            results[name] = run_route(experiment, args.steps, Path(root) / experiment)
            print(f"ran {name}: {len(results[name])} steps", file=sys.stderr)
    base = median(results["none (ppo_clip_train_infer)"], "train/step_s", args.skip)
    print(f"median over steps {args.skip}..{args.steps - 1}; tiny policy, {RUN}")
    print("| route | step s | ratio | extra s/step | storage MB | push pause s | stall / wait s per step | max gap |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        step = median(rows, "train/step_s", args.skip)
        storage = median(rows, "snapshot/resident_gb", args.skip) * 1024
        stall = median(rows, "interrupt_sync/stall_s", args.skip)
        waits = [row.get("dedicated/group_wait_s") for row in rows if "dedicated/group_wait_s" in row]
        if waits:  # cumulative in the log: per-step increase
            stall = (waits[-1] - waits[args.skip]) / max(len(waits) - 1 - args.skip, 1)
        print(
            f"| {name} | {step:.3f} | {step / base:.2f}x | {step - base:+.3f} | "
            f"{storage if storage == storage else 0:.1f} | {median(rows, 'rollout/engine_pause_s', args.skip):.3f} | "
            f"{stall if stall == stall else 0:.3f} | {max(row['train/version_gap_max'] for row in rows):.0f} |"
        )


if __name__ == "__main__":
    main()
