"""Flat memory over a long run that survives faults: the soak benchmark (a measurement, not a test).

One run of `--steps` optimizer steps with an exact reference (snapshots), an environment whose
every `--fail-every`-th agent turn raises (dropped with the reason `env_error`), one engine core
SIGKILLed and replaced (`rollout.engine_restarts=1`), and the trainer SIGKILLed twice at kill points
(`train_step` at 30% of the steps, `batch_wait` at 60%), each time resumed from its latest checkpoint
(which keeps the pending episodes and continues those in flight). Every `--sample-s` seconds the
resident memory (RSS) of the trainer and of its engine processes is sampled.

Reported, for each process's lifetime (a segment's trainer; an engine until it is killed, and the one
that replaced it): the RSS growth after warm-up, the median of its last tenth of samples over the median
of its first tenth after its first `--warmup` steps, against the target of at most 5%; and per segment,
over all its rows: the accounting identity, the most snapshots resident (cap: rollout.max_version_gap +
1) and the most episodes pending (cap: rollout.buffer_capacity), and the drops by reason so far.

    python benchmarks/bench_soak.py                        # 2,000 steps
    python benchmarks/bench_soak.py --steps 300 --warmup 50  # a shorter check
    python benchmarks/bench_soak.py --report-only --out DIR  # the report again, from DIR's samples and logs

The samples go to `<out>/rss.csv` and each segment's run to `<out>/segment<N>/`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
ENGINE_MARK = "VLLM::EngineCore"


def last_step(run_dir: Path) -> int:
    """The last optimizer step in the run's metrics.csv (-1 before the first)."""
    return max((int(row["step"]) for row in step_rows(run_dir / "metrics.csv")), default=-1)


def engine_processes(process: psutil.Process) -> list[psutil.Process]:
    """The engine-core processes below `process`."""
    found = []
    for child in process.children(recursive=True):
        try:
            if ENGINE_MARK in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:  # gone meanwhile
            pass
    return found


def rss_mb(process: psutil.Process) -> tuple[float, float]:
    """(trainer RSS, summed RSS of its engine processes) in MB."""
    engines = 0.0
    for engine in engine_processes(process):
        with contextlib.suppress(psutil.Error):  # gone meanwhile
            engines += engine.memory_info().rss / 1e6
    return process.memory_info().rss / 1e6, engines


def kill_an_engine(process: psutil.Process) -> bool:
    for engine in engine_processes(process)[:1]:
        try:
            engine.send_signal(signal.SIGKILL)
            return True
        except psutil.Error:
            pass
    return False


def run_segment(
    index: int, overrides: list[str], kill_at: str | None, engine_kill_step: int | None, args, writer
) -> tuple[Path, int]:
    run_dir = args.out / f"segment{index}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **({"LIT_ASYNCRL_KILL_AT": kill_at} if kill_at else {})}
    command = [sys.executable, "-m", "lit_asyncrl.train", *overrides, f"hydra.run.dir={run_dir}"]
    with open(args.out / f"segment{index}.log", "w") as log:
        child = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        process, killed_engine = psutil.Process(child.pid), False
        while child.poll() is None:
            try:
                trainer, engines = rss_mb(process)
            except psutil.Error:
                break
            step = last_step(run_dir)
            writer.writerow(
                {
                    "time_s": round(time.monotonic() - args.started, 1),
                    "segment": index,
                    "step": step,
                    "trainer_mb": round(trainer, 1),
                    "engine_mb": round(engines, 1),
                }
            )
            if engine_kill_step is not None and not killed_engine and step >= engine_kill_step:
                killed_engine = kill_an_engine(process)
            time.sleep(args.sample_s)
    return run_dir, child.wait()


def growth(samples: list[dict], key: str, warmup: int) -> float | None:
    """Median of the last tenth over the median of the first tenth, after `warmup` steps."""
    kept = [row[key] for row in samples if row["step"] >= warmup and row[key] > 0]
    if len(kept) < 20:
        return None
    tenth = len(kept) // 10
    return statistics.median(kept[-tenth:]) / statistics.median(kept[:tenth]) - 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100, help="steps after a (re)start before growth is measured")
    parser.add_argument("--fail-every", type=int, default=50)
    parser.add_argument("--sample-s", type=float, default=2.0)
    parser.add_argument("--out", type=Path, default=REPO / "outputs" / "soak")
    parser.add_argument("--report-only", action="store_true", help="report on the runs already in --out")
    args = parser.parse_args()
    if args.report_only:
        report(args.out, 3, args.warmup)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    args.started = time.monotonic()
    base = [
        "experiment=snapshot",
        f"trainer.max_steps={args.steps}",
        "checkpoint_every=25",
        "trainer.val_check_interval=1000000",
        "trainer.num_sanity_val_steps=0",
        "rollout.engine_restarts=1",
        "env._target_=tests.integration.faulty_env.FaultyGuessNumberEnv",
        f"+env.fail_every={args.fail_every}",
        "+env.fail_after=1000000000",
        "rollout.env_failure_limit=0.9",
    ]
    # (kill point, step at which an engine core is killed): the engine dies in the second segment.
    plan = [
        (f"train_step@{int(args.steps * 0.3)}", None),
        (f"batch_wait@{int(args.steps * 0.6)}", int(args.steps * 0.45)),
        (None, None),
    ]
    samples_path = args.out / "rss.csv"
    resume: list[str] = []
    with open(samples_path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["time_s", "segment", "step", "trainer_mb", "engine_mb"])
        writer.writeheader()
        for index, (kill_at, engine_kill_step) in enumerate(plan):
            run_dir, code = run_segment(index, base + resume, kill_at, engine_kill_step, args, writer)
            handle.flush()
            print(
                f"segment {index}: exit {code}, last step {last_step(run_dir)}"
                + (f" (killed at {kill_at})" if kill_at else "")
            )
            if kill_at is None:
                break
            (checkpoint,) = sorted(
                (run_dir / "checkpoints").glob("step=*.ckpt"), key=lambda path: int(path.stem.split("=")[1])
            )[-1:]
            resume = [f"ckpt_path='{checkpoint}'"]
    report(args.out, len(plan), args.warmup)


def report(out: Path, segments: int, warmup: int) -> None:
    """Growth per process lifetime, then per segment the accounting, the caps and the drops."""
    with open(out / "rss.csv", newline="") as handle:
        samples = [{key: float(value) for key, value in row.items()} for row in csv.DictReader(handle)]
    for index in range(segments):
        segment = [row for row in samples if row["segment"] == index and row["step"] >= 0]
        for key in ("trainer_mb", "engine_mb"):
            for life, lived in enumerate(lifetimes(segment, key)):
                value = growth(lived, key, lived[0]["step"] + warmup)
                text = "too few samples" if value is None else f"{100 * value:+.1f}%"
                steps = f"steps {lived[0]['step']:.0f}-{lived[-1]['step']:.0f}"
                print(
                    f"segment {index} {key.removesuffix('_mb')} {life} ({steps}) RSS growth after warm-up: {text} (target <= +5%)"
                )
    for index in range(segments):
        run_dir = out / f"segment{index}"
        rows = step_rows(run_dir / "metrics.csv")
        if not rows:
            continue
        config = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
        snapshot_cap, pending_cap = config.rollout.max_version_gap + 1, config.rollout.buffer_capacity
        broken = [
            row["step"] for row in rows if float(row["rollout/produced"]) != sum(float(row[key]) for key in ACCOUNTED)
        ]
        most_resident = max(float(row["snapshot/resident"]) for row in rows if row.get("snapshot/resident"))
        most_pending = max(float(row["rollout/pending"]) for row in rows)
        last = rows[-1]
        dropped = {
            key.removeprefix("rollout/dropped_"): last[key]
            for key in last
            if key.startswith("rollout/dropped_") and float(last[key] or 0)
        }
        print(
            f"segment {index}: steps {rows[0]['step']}-{last['step']}; accounting identity "
            + ("held in every row" if not broken else f"BROKEN at steps {broken[:5]}")
            + f"; most snapshots resident {most_resident:.0f} (cap {snapshot_cap}), most episodes pending {most_pending:.0f}"
            + f" (cap {pending_cap}); engine restarts in this segment {last.get('rollout/engine_restarts')}"
            + f"; dropped by reason, over the run so far: {dropped}"
        )


def lifetimes(samples: list[dict], key: str) -> list[list[dict]]:
    """The samples split where the process was replaced (its RSS fell below half the previous sample:
    a restarted engine starts small), each part one process's lifetime."""
    parts: list[list[dict]] = []
    for row in samples:
        if row[key] <= 0:
            continue
        if not parts or row[key] < 0.5 * parts[-1][-1][key]:
            parts.append([])
        parts[-1].append(row)
    return parts


ACCOUNTED = ("rollout/trained", "rollout/dropped", "rollout/pending")


def step_rows(path: Path) -> list[dict]:
    """The metrics.csv rows of training steps (validation rows have no task success)."""
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return [row for row in csv.DictReader(handle) if row.get("train/task_success")]


if __name__ == "__main__":
    main()
