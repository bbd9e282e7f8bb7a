"""A fake engine that answers each request with the next of its scripted text turns, and a text's ids."""

from __future__ import annotations

from lit_asyncrl.rollout.engine.protocol import TurnOutput
from tests.support.fakes import FakeEngine


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def scripted_engine(tokenizer, turns: list[str]) -> FakeEngine:
    """Answers the i-th request with the tokens of turns[i] (text, special tokens included)."""

    async def turn(engine, prompt_ids, on_tokens):
        out = ids(tokenizer, turns[len(engine.requests) - 1])
        logprobs = [-0.1] * len(out)
        if on_tokens is not None:  # a frozen engine's caller (a user model) streams nothing
            on_tokens(out, logprobs)
        return TurnOutput(out, logprobs, [engine.version] * len(out), "stop")

    return FakeEngine(turn)
