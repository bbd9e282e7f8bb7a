"""`python -m lit_asyncrl.envs.adapters.tau2 --replay-ground-truth --domain retail`: the replay check.

Prints `N/M tasks score 1` per split (M: the tasks the adapter can grade, which need no LLM judge), then
each task below 1 with the reason, and the tasks left out with theirs. Exit status 0 when every
replayed task scores 1.
"""

from __future__ import annotations

import argparse
import sys
import time

from lit_asyncrl.envs.adapters.tau2.domain import DOMAINS


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lit_asyncrl.envs.adapters.tau2", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--replay-ground-truth",
        action="store_true",
        required=True,
        help="play every task's expected actions through the adapter and grade them with tau2's evaluator",
    )
    parser.add_argument("--domain", choices=DOMAINS, required=True)
    parser.add_argument("--split", choices=("train", "test", "all"), default="all")
    parser.add_argument("--tasks", nargs="+", default=None, help="only these task ids (instead of --split)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from lit_asyncrl.envs.adapters.tau2.domain import load_domain
    from lit_asyncrl.envs.adapters.tau2.replay import replay_domain

    domain = load_domain(args.domain)
    splits = ["named"] if args.tasks else (["train", "test"] if args.split == "all" else [args.split])
    failed = 0
    for split in splits:
        started = time.monotonic()
        results = replay_domain(args.domain, split, args.tasks)
        scored = sum(result.reward == 1.0 for result in results)
        failed += len(results) - scored
        seconds = time.monotonic() - started
        print(f"{args.domain} {split}: {scored}/{len(results)} tasks score 1 ({seconds:.0f} s)")
        for result in results:
            if result.reward != 1.0:
                print(f"  task {result.task_id}: reward {result.reward:g}: {result.reason}")
    for task_id, reason in domain.skipped.items():
        print(f"  left out: task {task_id}: {reason}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
