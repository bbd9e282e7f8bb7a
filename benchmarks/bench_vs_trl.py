"""Time to a held-out target: TRL's GRPOTrainer against this library (sync and async), on one machine.

The same start model (the tiny policy fine-tuned a little on addition, `vs_trl_setup.py`), dataset file,
reward (exact match), prompts per step (8), samples per prompt (8), learning rate (3e-4, constant, AdamW
without weight decay), maximum completion (4 tokens), temperature (1.0, no top-k), group-normalised
advantages (TRL `scale_rewards="group"`, ours `rollout.advantage=grpo`), no KL term (TRL `beta=0`, ours
`model.kl_coef=0`) and token-mean loss (TRL `loss_type="dapo"`, ours `token_mean`). What differs: TRL
updates once per generation batch (`num_iterations=1`), so its ratio is 1 and its clip never acts; ours
trains with its default loss (`ppo_clip_train_infer`: the clipped ratio to the engine's log-probs
beside the train-inference mask), which on a sync batch is the same update up to the engine's numerics.
TRL generates with transformers' `generate` (KV cache on) in the trainer's process; ours with the vLLM
engine in its own process, pushing the weights after every step. Both use torch's CPU build with one
thread per core.

Each run trains for `--budget-s` seconds from its first step (start-up timed apart) and saves its policy
every `--mark-s` seconds of training (saving not counted). Afterwards one evaluator, this library's, on
one engine, plays every held-out prompt (206) 4 times at temperature 1 with each saved policy: the
success rate at each mark. Time to target is the first mark's training time at which the rate reached
`--target`; a run that never did reports "> budget".

    pip install -e '.[trl]'                      # TRL 1.16.0, never part of `make train`
    python benchmarks/bench_vs_trl.py --quick    # 3 seeds, 90 s per run (about 20 minutes)
    python benchmarks/bench_vs_trl.py            # 3 seeds, 240 s per run
    python benchmarks/bench_vs_trl.py --throughput   # SmolLM2-135M, 5 steps per run (`vs_trl_throughput.py`)
    python benchmarks/bench_vs_trl.py --latency-s 0.2 --target 0.33 --budget-s 120   # this library, sync against async

With `--latency-s`, each episode's reward waits that long (`env.latency_s`: the task's one environment answer)
and only this library runs, sync against async; the last line reads `time to target, sync / async at 200 ms: Y`.
`--task desk` runs the service desk instead (multi-turn: 2 or 3 tool answers an episode, each waiting
`--latency-s`; `desk_task.py`), this library only, from the tiny policy after the desk's warm start, and
evaluates 200 held-out requests at each mark; `--arm NAME:MODE:OVERRIDES` adds a setting beside sync and
async (what moves the time to target: batches in flight, the version-gap cap, group filters):

    python benchmarks/bench_vs_trl.py --task desk --latency-s 0.2 --target 0.6 --arm gap1:async:rollout.max_version_gap=1

The last line reads `time to target, TRL / lit_asyncrl (async): X` (the ratio of the medians; above 1
means this library reached the target sooner).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from desk_task import write_desk_start_model
from vs_trl_setup import BenchSettings, write_start_model, write_sums

HERE = Path(__file__).resolve().parent
SETTINGS = ("trl", "sync", "async")
#: What each setting is called in the report.
LABELS = {"trl": "TRL GRPOTrainer", "sync": "lit_asyncrl (sync)", "async": "lit_asyncrl (async)"}
TRL_VERSION = "1.16.0"
#: This library's runs and its evaluator as its entry points run them: idle OpenMP threads sleep
#: (`lit_asyncrl/cpu_threads.py`; `vs_trl_runs.py` imports torch first, so it is set here). TRL's
#: runs keep OpenMP's default, as TRL's users have it.
OURS_ENVIRONMENT = {"OMP_WAIT_POLICY": "PASSIVE"}
#: The desk's learning rate and warm start, as its findings setting has them (`conf/setting/findings.yaml`).
DESK_LEARNING_RATE, DESK_WARM_START_STEPS = 2e-4, 120
#: The level below which a comparison is called separated.
ALPHA = 0.05


def check_trl() -> None:
    found = subprocess.run(
        [sys.executable, "-c", "import trl; print(trl.__version__)"], capture_output=True, text=True, check=False
    )
    if found.stdout.strip() != TRL_VERSION:
        sys.exit(
            f"this benchmark needs trl=={TRL_VERSION} (found: {found.stdout.strip() or 'none'}): pip install -e '.[trl]'"
        )


@dataclasses.dataclass(frozen=True)
class Arm:
    """A setting compared: TRL, or this library in a `mode` with more overrides (`--arm`)."""

    name: str
    mode: str
    overrides: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Arm:
        """`NAME:MODE:OVERRIDE OVERRIDE ...`, e.g. `gap1:async:rollout.max_version_gap=1`."""
        name, mode, overrides = (text.split(":", 2) + [""])[:3]
        if mode not in ("sync", "async") or not name or name in ("trl", "sync", "async"):
            raise SystemExit(f"--arm {text!r}: expected NAME:sync|async:OVERRIDES, NAME other than trl, sync and async")
        return cls(name, mode, tuple(overrides.split()))


def run(arm: Arm, settings: BenchSettings, seed: int, paths: dict[str, Path], out: Path, task: str) -> dict:
    """One run in a process of its own (`vs_trl_runs.py`); its `result.json`."""
    command = [
        sys.executable,
        str(HERE / "vs_trl_runs.py"),
        arm.mode,
        "--settings",
        settings.to_json(),
        "--seed",
        str(seed),
        "--task",
        task,
        "--extra",
        json.dumps(list(arm.overrides)),
    ]
    command += ["--data", str(paths["data"]), "--start", str(paths["start"]), "--out", str(out)]
    process = subprocess.run(command, capture_output=True, text=True, check=False, env=run_environment(arm.mode))
    finished(process, arm.name)
    return json.loads((out / "result.json").read_text())


def run_environment(what: str) -> dict[str, str]:
    """The environment of a `what` run's process: OpenMP's default for TRL, `OURS_ENVIRONMENT` for ours."""
    environment = {key: value for key, value in os.environ.items() if key not in OURS_ENVIRONMENT}
    return environment if what.startswith("trl") else environment | OURS_ENVIRONMENT


def finished(process: subprocess.CompletedProcess, what: str) -> None:
    """Raise, with the end of its output, when a run's process failed."""
    if process.returncode != 0:
        tail = "\n".join((process.stdout + process.stderr).splitlines()[-30:])
        raise RuntimeError(f"the {what} run failed (exit {process.returncode}):\n{tail}")


def evaluate(
    settings: BenchSettings, paths: dict[str, Path], folders: list[Path], out: Path, task: str
) -> dict[str, list[float]]:
    command = [sys.executable, str(HERE / "vs_trl_runs.py"), "evaluate", "--settings", settings.to_json()]
    command += ["--task", task]
    command += ["--data", str(paths["data"]), "--start", str(paths["start"]), "--out", str(out)]
    command += ["--folders", *map(str, folders)]
    process = subprocess.run(command, capture_output=True, text=True, check=False, env=run_environment("evaluate"))
    finished(process, "evaluate")
    return json.loads((out / "evaluation.json").read_text())


def time_to_target(result: dict, rates: list[float], target: float) -> float | None:
    for mark, rate in zip(result["marks"], rates):
        if rate >= target:
            return mark["elapsed_s"]
    return None


def shown(seconds: float | None, budget_s: float) -> str:
    return f"> {budget_s:g}" if seconds is None else f"{seconds:.0f}"


def median_time(times: list[float | None], budget_s: float) -> tuple[float, bool]:
    """The median time to target, with runs that missed it counted at the budget; and whether that
    median is itself a bound (a missed run at or below it)."""
    counted = sorted(budget_s if t is None else t for t in times)
    middle = statistics.median(counted)
    return middle, any(t is None for t in times) and middle >= budget_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="90 s per run, marks every 10 s")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.4, help="held-out success rate to reach")
    parser.add_argument("--budget-s", type=float, default=None, help="training seconds per run (default 240, quick 90)")
    parser.add_argument("--out", type=Path, default=Path("outputs/vs_trl"), help="runs, saved policies and runs.json")
    parser.add_argument("--throughput", action="store_true", help="SmolLM2-135M tokens per second instead")
    parser.add_argument("--latency-s", type=float, default=0.0, help="per environment answer: sync against async only")
    parser.add_argument("--steps", type=int, default=5, help="--throughput: steps per run, the first a warm-up")
    parser.add_argument(
        "--task", choices=["sums", "desk"], default="sums", help="desk: the service desk, this library only"
    )
    parser.add_argument(
        "--arm",
        action="append",
        default=[],
        type=Arm.parse,
        help="another setting of this library beside sync and async, NAME:MODE:OVERRIDES (repeatable), "
        "e.g. gap1:async:rollout.max_version_gap=1",
    )
    args = parser.parse_args()
    ours_only = args.latency_s > 0 or args.task == "desk"
    if args.throughput or not ours_only:
        check_trl()
    if args.throughput:
        throughput(args.seeds, args.steps, args.out / "throughput")
        return
    settings = BenchSettings(budget_s=90.0, mark_s=10.0) if args.quick else BenchSettings()
    if args.task == "desk":
        settings = dataclasses.replace(settings, learning_rate=DESK_LEARNING_RATE, start_steps=DESK_WARM_START_STEPS)
    if args.budget_s is not None:
        settings = dataclasses.replace(settings, budget_s=args.budget_s)
    settings = dataclasses.replace(settings, latency_s=args.latency_s)
    compared = [Arm(name, name) for name in ("sync", "async")] + args.arm
    if not ours_only:
        compared.insert(0, Arm("trl", "trl"))
    labels = {arm.name: LABELS.get(arm.name, f"lit_asyncrl ({arm.name})") for arm in compared}
    args.out.mkdir(parents=True, exist_ok=True)
    paths = prepare(args.task, settings, args.out)
    print(f"settings: {dataclasses.asdict(settings)}; task {args.task}; target {args.target}; seeds {args.seeds}")
    for arm in args.arm:
        print(f"{labels[arm.name]}: {arm.mode} with {' '.join(arm.overrides)}")
    if not ours_only:
        speed = run(Arm("trl-generate", "trl-generate"), settings, 0, paths, args.out / "trl_generate", args.task)
        print(
            f"transformers' generate alone (TRL's generation), one step's completions: {speed['tokens_per_s']:.0f} tok/s"
        )
    results: dict[str, list[dict]] = {arm.name: [] for arm in compared}
    folders = []
    for seed in range(args.seeds):
        for arm in compared:
            folder = args.out / f"{arm.name}_seed{seed}"
            results[arm.name].append(run(arm, settings, seed, paths, folder, args.task))
            folders.append(folder)
            done = results[arm.name][-1]
            print(f"{labels[arm.name]} seed {seed}: {done['steps']} steps in {done['train_s']:.0f} s", flush=True)
    rates = evaluate(settings, paths, folders, args.out / "evaluation", args.task)
    print(f"\nheld-out success of the start model: {rates['start'][0]:.3f}")
    print(
        "setting                | seed | steps | gen tok/s | trained tok/s | peak MB | start-up s | to target s | success at each mark"
    )
    times: dict[str, list[float | None]] = {arm.name: [] for arm in compared}
    for seed in range(args.seeds):
        for arm in compared:
            result = results[arm.name][seed]
            curve = rates[str(args.out / f"{arm.name}_seed{seed}")]
            reached = time_to_target(result, curve, args.target)
            times[arm.name].append(reached)
            print(
                f"{labels[arm.name]:22} | {seed:4} | {result['steps']:5} | {result['generated_tokens'] / result['train_s']:9.0f} | "
                f"{result['trained_tokens'] / result['train_s']:13.0f} | {result['peak_memory_mb']:7.0f} | "
                f"{result['setup_s']:10.1f} | {shown(reached, settings.budget_s):>11} | "
                + " ".join(f"{rate:.2f}" for rate in curve)
            )
    (args.out / "runs.json").write_text(
        json.dumps(
            {
                "settings": dataclasses.asdict(settings),
                "task": args.task,
                "arms": [dataclasses.asdict(arm) for arm in compared],
                "target": args.target,
                "results": results,
                "rates": rates,
            },
            indent=1,
        )
    )
    medians = {arm.name: median_time(times[arm.name], settings.budget_s) for arm in compared}
    for arm in compared:
        middle, bound = medians[arm.name]
        print(f"median time to target, {labels[arm.name]}: {'>= ' if bound else ''}{middle:.0f} s")
    for arm in args.arm:
        print(sooner_line(times[arm.name], times["async"], labels[arm.name], labels["async"], settings.budget_s))
    if ours_only:
        print(comparison(times["sync"], times["async"], labels["async"], settings.budget_s, goal=2.8, slower="sync"))
        latency_ms = f"{settings.latency_s * 1000:.0f} ms"
        print(f"time to target, sync / async at {latency_ms}: {ratio_shown(medians['sync'], medians['async'])}")
        return
    for ours in ("sync", "async"):
        print(comparison(times["trl"], times[ours], labels[ours], settings.budget_s))
    print(f"time to target, TRL / lit_asyncrl (async): {ratio_shown(medians['trl'], medians['async'])}")


def prepare(task: str, settings: BenchSettings, out: Path) -> dict[str, Path]:
    """The task's files: the start model both sides train from (made once) and, for sums, the dataset."""
    paths = {"data": out / "sums.jsonl", "start": out / ("desk_start" if task == "desk" else "start")}
    write_sums(paths["data"])
    if not (paths["start"] / "config.json").exists():
        if task == "desk":
            write_desk_start_model(paths["start"], settings.start_steps)
        else:
            write_start_model(paths["data"], paths["start"], settings.start_steps)
    return paths


def throughput(seeds: int, steps: int, out: Path) -> None:
    """SmolLM2-135M: completion tokens per second over the steps after the first, per library and seed."""
    from lit_asyncrl.examples.word_problems import main as write_word_problems

    out.mkdir(parents=True, exist_ok=True)
    data = out / "word_problems.jsonl"
    write_word_problems([str(data)])
    rates: dict[str, list[float]] = {what: [] for what in SETTINGS}
    print("setting                | seed | steps timed | s per step | generated tok/s | trained tok/s | peak MB")
    for seed in range(seeds):
        for what in SETTINGS:
            folder = out / f"{what}_seed{seed}"
            command = [sys.executable, str(HERE / "vs_trl_throughput.py"), what, "--steps", str(steps)]
            command += ["--seed", str(seed), "--data", str(data), "--out", str(folder)]
            finished(subprocess.run(command, capture_output=True, text=True, check=False), what)
            result = json.loads((folder / "result.json").read_text())
            rates[what].append(result["trained_tokens"] / result["train_s"])
            print(
                f"{LABELS[what]:22} | {seed:4} | {result['steps']:11} | {result['train_s'] / result['steps']:10.1f} | "
                f"{result['generated_tokens'] / result['train_s']:15.1f} | {rates[what][-1]:13.1f} | "
                f"{result['peak_memory_mb']:7.0f}",
                flush=True,
            )
    for ours in ("sync", "async"):
        ratio = statistics.median(rates[ours]) / statistics.median(rates["trl"])
        print(
            f"trained tokens per second, {LABELS[ours]} / TRL (medians): {ratio:.2f}; {welch_line(rates[ours], rates['trl'])}"
        )


def welch_line(first: list[float], second: list[float]) -> str:
    from lit_asyncrl.report.comparisons import welch

    difference, low, high, _, p = welch(first, second)
    return f"difference {difference:+.1f} tok/s, 95% interval [{low:+.1f}, {high:+.1f}], Welch p = {p:.3f}"


def comparison(
    trl: list[float | None],
    ours: list[float | None],
    label: str,
    budget_s: float,
    goal: float = 3.0,
    slower: str = "TRL",
) -> str:
    """The `slower` side's times to target (`trl`: TRL's, or sync's) against ours, by an exact two-sided
    Mann-Whitney U test (a run that missed the target ranks after every run that reached it), and the goal:
    ours at least `goal` times sooner, tested as the slower side's times against `goal` times ours."""
    from scipy import stats

    def ranked(times: list[float | None], factor: float = 1.0) -> list[float]:
        return [budget_s * 10 if t is None else t * factor for t in times]

    sooner = stats.mannwhitneyu(ranked(trl), ranked(ours), alternative="two-sided", method="exact").pvalue
    goal_p = stats.mannwhitneyu(ranked(trl), ranked(ours, goal), alternative="two-sided", method="exact").pvalue
    if goal_p >= ALPHA:
        verdict = f"not separable with {len(trl)} seeds"
    elif statistics.median(ranked(trl)) > statistics.median(ranked(ours, goal)):
        verdict = "held"
    else:
        verdict = "did not hold"
    return (
        f"{slower} against {label}: which reaches the target sooner, p = {sooner:.3f}; "
        f"goal ({label} at least {goal:g}x sooner): p = {goal_p:.3f}, {verdict}"
    )


def sooner_line(first: list[float | None], second: list[float | None], label: str, other: str, budget_s: float) -> str:
    """Which of two settings reaches the target sooner, by the exact two-sided Mann-Whitney U test (a
    run that missed the target ranks after every run that reached it)."""
    from scipy import stats

    ranked = [[budget_s * 10 if t is None else t for t in times] for times in (first, second)]
    p = stats.mannwhitneyu(*ranked, alternative="two-sided", method="exact").pvalue
    verdict = f"not separable with {len(first)} and {len(second)} seeds" if p >= ALPHA else "separated"
    return f"{label} against {other}: which reaches the target sooner, p = {p:.3f}, {verdict}"


def ratio_shown(trl: tuple[float, bool], ours: tuple[float, bool]) -> str:
    """TRL's median time over ours, as a bound where a median is one."""
    (trl_s, trl_bound), (ours_s, ours_bound) = trl, ours
    if trl_bound and ours_bound:
        return "neither reached the target"
    if ours_bound:
        return f"<= {trl_s / ours_s:.2f}"
    if trl_bound:
        return f">= {trl_s / ours_s:.2f}"
    return f"{trl_s / ours_s:.2f}"


if __name__ == "__main__":
    main()
