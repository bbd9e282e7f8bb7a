"""Idle OpenMP threads that sleep (this library's default) against threads that spin, on 2 CPU cores.

torch runs its CPU operators on an OpenMP thread pool. After each parallel region GNU OpenMP keeps
those threads spinning for a while (its `GOMP_SPINCOUNT`, 300,000 spins when `OMP_WAIT_POLICY` is
unset) before they sleep. A run here is two busy processes on the same cores, the trainer and the
engine core, and threads spinning in one take the cores the other needs. `lit_asyncrl` therefore
sets `OMP_WAIT_POLICY=PASSIVE` unless it is set already (`lit_asyncrl/cpu_threads.py`); this
benchmark measures that choice against OpenMP's own default, restored by `GOMP_SPINCOUNT=300000`.

Each round runs the default training run (tiny policy, guess-the-number, its 30 warm-start steps,
then `--steps` RL steps) under each setting, the order alternating by round: once alone, then two
copies at once (as a sweep with the parallel launcher or the two-worker test suite runs them).
Measured per run: the process's wall time and its CPU time (user + system, with the engine core it
waited for), and the median RL step time from its metrics.csv. A warm-up run comes first, unscored.
Printed: per-round values, medians per setting and the ratio sleeping / spinning.

    .venv/bin/python benchmarks/bench_omp_wait_policy.py            # 3 rounds (~9 min on 2 cores)
    .venv/bin/python benchmarks/bench_omp_wait_policy.py --rounds 1
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: setting -> what the run's environment changes: the library's default, and OpenMP's own.
SETTINGS = {"sleeping": {}, "spinning": {"GOMP_SPINCOUNT": "300000"}}
SMALL_ENGINE = ["rollout.kv_cache_gib=0.25"]


def start_run(setting: str, out_dir: Path, steps: int, seed: int) -> tuple[subprocess.Popen, float]:
    environment = os.environ.copy()
    environment.pop("OMP_WAIT_POLICY", None)
    environment.pop("GOMP_SPINCOUNT", None)
    environment.update(SETTINGS[setting])
    command = [
        sys.executable,
        "-m",
        "lit_asyncrl.train",
        f"trainer.max_steps={steps}",
        f"seed={seed}",
        "+trainer.enable_progress_bar=false",
        *SMALL_ENGINE,
        f"hydra.run.dir={out_dir}",
    ]
    out_dir.mkdir(parents=True)
    with open(out_dir / "console.txt", "w") as console:
        process = subprocess.Popen(command, cwd=REPO, env=environment, stdout=console, stderr=subprocess.STDOUT)
    return process, time.perf_counter()


def finish_run(process: subprocess.Popen, started: float, out_dir: Path) -> dict[str, float]:
    """Wall and CPU seconds of the finished run, and its median RL step time (its first step has none)."""
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(
            f"run in {out_dir} failed ({process.returncode}):\n{(out_dir / 'console.txt').read_text()[-4000:]}"
        )
    with open(out_dir / "metrics.csv", newline="") as handle:
        step_s = [float(row["train/step_s"]) for row in csv.DictReader(handle) if row.get("train/step_s")]
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "step_s": statistics.median(step_s)}


def measure(setting: str, work_dir: Path, steps: int, copies: int) -> list[dict[str, float]]:
    """`copies` runs of the default run under `setting`, started together; their measurements."""
    started = [
        (
            *start_run(setting, work_dir / f"{setting}_{copies}_{copy}", steps, seed=copy),
            work_dir / f"{setting}_{copies}_{copy}",
        )
        for copy in range(copies)
    ]
    return [finish_run(process, start, out_dir) for process, start, out_dir in started]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="RL steps per run")
    arguments = parser.parse_args()
    results = {(setting, copies): [] for setting in SETTINGS for copies in (1, 2)}
    with tempfile.TemporaryDirectory(prefix="bench_omp_") as temp:
        work = Path(temp)
        measure("sleeping", work / "warm_up", arguments.steps, copies=1)
        for round_ in range(arguments.rounds):
            order = list(SETTINGS) if round_ % 2 == 0 else list(reversed(SETTINGS))
            for copies in (1, 2):
                for setting in order:
                    runs = measure(setting, work / f"round{round_}", arguments.steps, copies)
                    results[(setting, copies)].extend(runs)
                    for run in runs:
                        print(
                            f"round {round_ + 1} {setting:8} {copies} at once: wall {run['wall_s']:6.1f} s  "
                            f"cpu {run['cpu_s']:6.1f} s  step {run['step_s']:.3f} s",
                            flush=True,
                        )
    print(f"\nmedians over {arguments.rounds} rounds ({arguments.steps} RL steps per run; ratio = sleeping / spinning)")
    for copies in (1, 2):
        for key in ("wall_s", "cpu_s", "step_s"):
            sleeping = statistics.median(run[key] for run in results[("sleeping", copies)])
            spinning = statistics.median(run[key] for run in results[("spinning", copies)])
            print(
                f"{copies} at once  {key:7} sleeping {sleeping:7.3f}  spinning {spinning:7.3f}  ratio {sleeping / spinning:.2f}"
            )


if __name__ == "__main__":
    main()
