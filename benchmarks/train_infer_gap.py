"""The training-inference gap on a real model: |log pi_old - log mu| by version gap, fp32 vs bf16 engine.

Runs `experiment=smollm2_arithmetic` (SmolLM2-135M-Instruct, exact pi_old from snapshots, fp32
trainer) once per engine dtype, one after the other, and tabulates the per-gap metrics the module
logs (`train/ref_behavior_logratio_absmean|absmax/gap_n`). With exact pi_old the ratio pi_old / mu
is the discrepancy alone, so the table shows what the engine's precision adds at every staleness.

    .venv/bin/python benchmarks/train_infer_gap.py                 # both runs, then the table (~10 min on 2 cores)
    .venv/bin/python benchmarks/train_infer_gap.py --runs DIR ...  # the table of finished runs (label = dir name)
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from lit_asyncrl.losses.metrics import GAP_BUCKETS

PREFIX = "train/ref_behavior_logratio_"


def run(dtype: str, out_dir: Path, steps: int) -> Path:
    run_dir = out_dir / dtype
    command = [
        sys.executable, "-m", "lit_asyncrl.train", "experiment=smollm2_arithmetic", f"rollout.dtype={dtype}",
        f"trainer.max_steps={steps}", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    print("running:", " ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return run_dir


def gap_rows(run_dir: Path) -> dict[str, dict[str, list[float]]]:
    """Per gap bucket: the per-step means, maxima and policy-token steps of one run."""
    table: dict[str, dict[str, list[float]]] = {}
    with open(run_dir / "metrics.csv") as handle:
        for row in csv.DictReader(handle):
            for bucket in ("all", *GAP_BUCKETS):
                suffix = "" if bucket == "all" else f"/{bucket}"
                mean, peak = row.get(f"{PREFIX}absmean{suffix}"), row.get(f"{PREFIX}absmax{suffix}")
                if mean and peak:
                    entry = table.setdefault(bucket, {"mean": [], "max": []})
                    entry["mean"].append(float(mean))
                    entry["max"].append(float(peak))
    return table


def print_table(runs: dict[str, Path]) -> None:
    tables = {label: gap_rows(path) for label, path in runs.items()}
    labels = list(tables)
    print("| version gap | " + " | ".join(f"{label} mean | {label} max | {label} steps" for label in labels) + " |")
    print("|---|" + "---:|" * (3 * len(labels)))
    for bucket in ("all", *GAP_BUCKETS):
        if not any(bucket in table for table in tables.values()):
            continue
        cells = []
        for label in labels:
            entry = tables[label].get(bucket)
            if entry is None:
                cells += ["-", "-", "0"]
            else:
                cells += [f"{statistics.mean(entry['mean']):.2e}", f"{max(entry['max']):.2e}", str(len(entry["mean"]))]
        print(f"| {bucket.replace('gap_', '')} | " + " | ".join(cells) + " |")
    print("mean: the average over steps of each step's mean over its policy tokens; max: over all steps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="*", type=Path, help="finished run dirs to tabulate instead of running")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run")
    args = parser.parse_args()
    if args.runs:
        print_table({path.name: path for path in args.runs})
        return
    with tempfile.TemporaryDirectory(prefix="train_infer_gap_") as out:
        runs = {dtype: run(dtype, Path(out), args.steps) for dtype in ("float32", "bfloat16")}
        print_table(runs)


if __name__ == "__main__":
    main()
