"""Scripted solvers of gem's games, for the warm start's demonstrations (`GemEnv.demonstration`)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any


def _mastermind_solver(game: Any):
    """Guesses the first code consistent with every answer so far (parses gem's peg counts)."""
    digits = range(1, game.num_numbers + 1)
    if game.duplicate_numbers:
        candidates = list(itertools.product(digits, repeat=game.code_length))
    else:
        candidates = list(itertools.permutations(digits, game.code_length))
    while True:
        guess = candidates[0]
        feedback = yield " ".join(map(str, guess))
        match = re.search(r"receives (\d+) black peg\(s\) and (\d+) white peg\(s\)", feedback or "")
        if match is None:
            return
        pegs = (int(match.group(1)), int(match.group(2)))
        candidates = [code for code in candidates if _pegs(guess, code) == pegs]


def _pegs(guess: tuple[int, ...], code: tuple[int, ...]) -> tuple[int, int]:
    black = sum(g == c for g, c in zip(guess, code))
    common = sum(min(guess.count(d), code.count(d)) for d in set(guess))
    return black, common - black


def _guess_the_number_solver(game: Any):
    """Bisection on gem's `higher` / `lower` hints."""
    low = game.min_number
    high = game.max_number
    while low <= high:
        guess = (low + high) // 2
        feedback = yield str(guess)
        if "is higher than" in (feedback or ""):
            low = guess + 1
        elif "is lower than" in (feedback or ""):
            high = guess - 1
        else:
            return


#: A scripted solver per gem game class: a generator that yields guesses and is sent gem's feedback.
SOLVERS: dict[str, Callable[[Any], Any]] = {
    "MastermindEnv": _mastermind_solver,
    "GuessTheNumberEnv": _guess_the_number_solver,
}
