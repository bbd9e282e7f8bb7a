"""Two Python interpreters of one version side by side on the work the tests and a run spend pure-Python
time on: composing the shipped Hydra configs.

Each interpreter runs the same code, .venv's packages (`PYTHONPATH` set to its site-packages, which
both can import as they are one Python version), in a process of its own per round; the rounds
alternate between them, and each round composes the config a few times before it measures. Printed:
each round's mean time of one composition per interpreter, their medians and the ratio. By default
the interpreters are the one `python3` names and /usr/bin/python3, the two that
`tools/venv_interpreter.py` chooses between.

    .venv/bin/python benchmarks/bench_interpreters.py                 # 5 rounds, ~1 min on 2 cores
    .venv/bin/python benchmarks/bench_interpreters.py --interpreters /usr/bin/python3.11 ~/.pyenv/versions/3.11.7/bin/python3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig

from lit_asyncrl.config_dir import config_dir

#: Run by each interpreter: warm-up compositions, then the mean seconds of `count` more.
COMPOSE = """
import sys, time
from hydra import compose, initialize_config_dir
config_dir = sys.argv[1]
warmup = int(sys.argv[2])
count = int(sys.argv[3])
overrides = [[], ["loss=cispo"], ["loss=gspo"], ["experiment=task_mix"], ["experiment=ppo_ewma"]]

def compose_times(n):
    for index in range(n):
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            compose(config_name="train", overrides=overrides[index % len(overrides)], return_hydra_config=True)

compose_times(warmup)
started = time.perf_counter()
compose_times(count)
print((time.perf_counter() - started) / count)
"""


def executable_and_version(interpreter: str) -> tuple[str, str]:
    """What `interpreter` (a path or a launcher such as pyenv's shim) runs as, and its minor version."""
    asked = "import os, sys; print(os.path.realpath(sys.executable)); print(sys.version_info[:2])"
    reported = subprocess.run([interpreter, "-c", asked], capture_output=True, text=True, check=True)
    executable, version = reported.stdout.splitlines()
    return executable, version


def default_interpreters() -> list[str]:
    python3 = shutil.which("python3")
    if python3 is None:
        sys.exit("no python3 on PATH: name two interpreters with --interpreters")
    return [python3, "/usr/bin/python3"]


def seconds_per_composition(interpreter: str, warmup: int, count: int) -> float:
    environment = dict(os.environ, PYTHONPATH=sysconfig.get_paths()["purelib"])
    command = [interpreter, "-c", COMPOSE, config_dir(), str(warmup), str(count)]
    result = subprocess.run(command, capture_output=True, text=True, env=environment)
    if result.returncode != 0:
        sys.exit(f"{interpreter} failed to compose:\n{result.stderr[-3000:]}")
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interpreters", nargs=2, default=None, help="two interpreters of one Python version")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--count", type=int, default=30)
    args = parser.parse_args()
    described = [executable_and_version(name) for name in args.interpreters or default_interpreters()]
    interpreters = [executable for executable, _ in described]
    if interpreters[0] == interpreters[1]:
        sys.exit(f"both interpreters are {interpreters[0]}: nothing to compare")
    if described[0][1] != described[1][1]:
        sys.exit(f"Python {described[0][1]} against {described[1][1]}: .venv's packages fit one version only")
    times: dict[str, list[float]] = {interpreter: [] for interpreter in interpreters}
    for round_index in range(args.rounds):
        order = interpreters if round_index % 2 == 0 else interpreters[::-1]
        for interpreter in order:
            times[interpreter].append(seconds_per_composition(interpreter, args.warmup, args.count))
        print(f"round {round_index + 1}: " + ", ".join(f"{name} {times[name][-1]:.4f} s" for name in interpreters))
    medians = {interpreter: statistics.median(values) for interpreter, values in times.items()}
    for interpreter, median in medians.items():
        print(f"{interpreter}: median {median:.4f} s per composition over {args.rounds} rounds")
    first, second = interpreters
    print(f"{second} / {first}: {medians[second] / medians[first]:.3f}")


if __name__ == "__main__":
    main()
