"""An RL step of SmolLM2-135M with a LoRA adapter against one with the last 2 layers trained, side by side.

Runs the Hydra entry once per way of training (same seed, task, batch, reference and step count):
`experiment=smollm2_lora` (rank 8 on every attention and MLP projection, each version pushed as the
adapter) and `experiment=smollm2_arithmetic` (`model.train_last_layers=2`, each version pushing the
trained layers), then reads each run's metrics.csv and prints medians over the steps after the first
few: the whole step (`train/step_s`: waiting for rollouts, the snapshot, the update and the push), the
push and the engine's pause, the bytes pushed, the snapshots' resident memory, and LoRA against the last
2 layers.

    .venv/bin/python benchmarks/bench_lora_rl_step.py             # 12 steps each (~10 min on 2 cores)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from hydra_runs import median, run_steps

WAYS = {"LoRA rank 8": "smollm2_lora", "last 2 layers": "smollm2_arithmetic"}
KEYS = {
    "step s": "train/step_s",
    "push s": "rollout/weight_push_s",
    "engine pause s": "rollout/engine_pause_s",
    "MB pushed": "rollout/weight_push_bytes",
    "snapshots MiB": "snapshot/resident_gb",  # logged in GiB
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out of the medians")
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.2f}")
    results = {}
    with tempfile.TemporaryDirectory() as root:
        for name, experiment in WAYS.items():
            results[name] = run_steps(
                [f"experiment={experiment}", f"trainer.max_steps={args.steps}"], Path(root) / experiment
            )
            print(f"ran {name}: {len(results[name])} steps", file=sys.stderr)
    print(f"medians over steps {args.skip}..{args.steps - 1}")
    print(f"| trained | {' | '.join(KEYS)} |")
    print(f"|---|{'---:|' * len(KEYS)}")
    for name, rows in results.items():
        values = {label: median(rows, key, args.skip) for label, key in KEYS.items()}
        values["MB pushed"] /= 1e6
        values["snapshots MiB"] *= 1024
        print(f"| {name} | {' | '.join(f'{value:.3f}' for value in values.values())} |")
    ratio = median(results["LoRA rank 8"], "train/step_s", args.skip) / median(
        results["last 2 layers"], "train/step_s", args.skip
    )
    print(f"step, LoRA / last 2 layers: {ratio:.2f}x")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
