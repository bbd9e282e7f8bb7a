"""Writes a dataset of arithmetic word problems for `env=dataset`: nothing to download.

    python -m lit_asyncrl.examples.word_problems data/word_problems.jsonl

Each row has the columns the dataset task reads: `prompt` (the problem, a string), `answer` (the
number, checked by `env.rewards=[math_verify]`), `solution` (a worked answer, for a warm start with
`env.solution_key=solution`) and `split` (`test` for the held-out rows, `env.split_key=split`).
Problems add, subtract or multiply small numbers in a sentence about people and things; every
prompt is distinct, and the same seed writes the same file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from collections.abc import Callable
from pathlib import Path

NAMES = ("Tom", "Ana", "Lee", "Mia", "Sam", "Zoe", "Raj", "Eva")
THINGS = ("apples", "pencils", "books", "marbles", "cookies", "stickers", "shells", "cards")


@dataclasses.dataclass(frozen=True)
class Template:
    """One kind of problem: its sentence, how its two numbers are drawn and combined, and the sign shown."""

    text: str
    draw: Callable[[random.Random], tuple[int, int]]
    result: Callable[[int, int], int]
    sign: str


def _sum_terms(rng: random.Random) -> tuple[int, int]:
    return rng.randint(2, 20), rng.randint(2, 20)


def _difference_terms(rng: random.Random) -> tuple[int, int]:
    total = rng.randint(5, 30)
    return total, rng.randint(1, total - 1)


def _product_terms(rng: random.Random) -> tuple[int, int]:
    return rng.randint(2, 6), rng.randint(2, 6)


TEMPLATES = (
    Template(
        "{name} has {a} {things} and buys {b} more. How many {things} does {name} have now?",
        _sum_terms,
        int.__add__,
        "+",
    ),
    Template(
        "There are {a} {things} in a box and {b} {things} in a bag. How many {things} are there in all?",
        _sum_terms,
        int.__add__,
        "+",
    ),
    Template(
        "{name} had {a} {things} and gave {b} of them away. How many {things} are left?",
        _difference_terms,
        int.__sub__,
        "-",
    ),
    Template(
        "A shelf holds {a} {things}. {name} takes {b} of them. How many {things} are still on the shelf?",
        _difference_terms,
        int.__sub__,
        "-",
    ),
    Template(
        "{name} has {a} bags with {b} {things} in each. How many {things} does {name} have?",
        _product_terms,
        int.__mul__,
        "*",
    ),
)


def word_problems(rows: int, held_out: int, seed: int) -> list[dict[str, str]]:
    """`rows` distinct problems, the last `held_out` of them marked `split: test`, in a seeded order."""
    if not 0 < held_out < rows:
        raise ValueError(f"--held-out must be between 1 and --rows - 1 ({rows - 1}), got {held_out}")
    rng = random.Random(seed)
    problems: dict[str, dict[str, str]] = {}
    for _ in range(100 * rows):
        if len(problems) == rows:
            break
        template = rng.choice(TEMPLATES)
        a, b = template.draw(rng)
        prompt = template.text.format(name=rng.choice(NAMES), things=rng.choice(THINGS), a=a, b=b)
        answer = template.result(a, b)
        problems.setdefault(
            prompt, {"prompt": prompt, "answer": str(answer), "solution": f"{a} {template.sign} {b} = {answer}"}
        )
    if len(problems) < rows:
        raise ValueError(f"--rows {rows}: only {len(problems)} distinct problems were found")
    ordered = list(problems.values())
    return [{**row, "split": "test" if index >= rows - held_out else "train"} for index, row in enumerate(ordered)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the jsonl file to write (its folder is made)")
    parser.add_argument("--rows", type=int, default=600, help="problems in all (default 600)")
    parser.add_argument("--held-out", type=int, default=128, help="of them held out, split=test (default 128)")
    parser.add_argument("--seed", type=int, default=0, help="the same seed writes the same file (default 0)")
    args = parser.parse_args(argv)
    rows = word_problems(args.rows, args.held_out, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} problems ({args.held_out} held out) to {args.out}")


if __name__ == "__main__":
    main()
