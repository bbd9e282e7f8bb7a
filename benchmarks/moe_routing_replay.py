"""Routing replay in training runs: the tiny MoE policy with a bf16 engine, the engine's routing recorded
in every run, replayed in half of them (`model.routing_replay=true`), paired by seed.

Each run trains `--steps` steps with exact old log-probs from snapshots (`reference=snapshot`), so the
logged |log pi_old - log mu| (`train/ref_behavior_logratio_absmean|absmax`) is the training-inference
discrepancy alone: under replay both sides run the same experts, without it a token whose routing a bf16
engine flipped is computed by other experts in the trainer. Printed per seed: the discrepancy's mean and
max over the steps, the share of tokens the r_d mask keeps (`train/train_infer_mask`) and the routing
flips (`train/routing_flipped`); then the paired differences with a paired t-test.

    .venv/bin/python benchmarks/moe_routing_replay.py --seeds 3 --steps 30   # 6 runs, ~10 min on 2 cores
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from hydra_runs import run_steps
from scipy import stats

METRICS = {
    "discrepancy mean": ("train/ref_behavior_logratio_absmean", statistics.mean),
    "discrepancy max": ("train/ref_behavior_logratio_absmax", max),
    "mask keeps": ("train/train_infer_mask", statistics.mean),
    "routing flipped": ("train/routing_flipped", statistics.mean),
}


def run_summary(replay: bool, seed: int, steps: int, out_dir: Path) -> dict[str, float]:
    overrides = [
        "model=tiny_moe",
        "rollout.capture_routing=true",
        f"model.routing_replay={str(replay).lower()}",
        "rollout.dtype=bfloat16",
        "reference=snapshot",
        "rollout.kv_cache_gib=0.25",
        f"trainer.max_steps={steps}",
        f"seed={seed}",
    ]
    rows = run_steps(overrides, out_dir)
    return {name: reduce([row[key] for row in rows if key in row]) for name, (key, reduce) in METRICS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="lit_asyncrl_moe_replay_") as scratch:
        for seed in range(args.seeds):
            for replay in (False, True):
                results[replay].append(run_summary(replay, seed, args.steps, Path(scratch) / f"{replay}_{seed}"))
    print(f"tiny MoE, bf16 engine, snapshots, {args.steps} steps per run")
    print("| routing | seed | " + " | ".join(METRICS) + " |")
    print("|---|---:|" + "---:|" * len(METRICS))
    for replay, label in ((False, "own"), (True, "replayed")):
        for seed, summary in enumerate(results[replay]):
            print(f"| {label} | {seed} | " + " | ".join(f"{summary[name]:.3e}" for name in METRICS) + " |")
    for name in METRICS:
        own = [summary[name] for summary in results[False]]
        replayed = [summary[name] for summary in results[True]]
        differences = [after - before for before, after in zip(own, replayed)]
        test = stats.ttest_rel(replayed, own) if len(own) > 1 else None
        p_value = f"{test.pvalue:.3g}" if test is not None else "n/a"
        print(f"{name}: replayed - own per seed {[f'{d:+.2e}' for d in differences]}, paired t-test p = {p_value}")


if __name__ == "__main__":
    main()
