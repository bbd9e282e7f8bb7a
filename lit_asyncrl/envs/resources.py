"""What a task may ask of the runner for a run: an engine of its own for a frozen model.

A task never starts an engine itself (`envs/` does not depend on the runner): the rollout service
passes `Environment.start` a `make_engine`, which starts an engine for a `FrozenModel` and returns
it serving; the task shuts it down in `close`. A simulated customer played by a language model
(`LLMUser`) is the task that needs one.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class FrozenModel:
    """A model whose weights never change in the run, and the engine settings it needs."""

    path: str
    dtype: str = "float32"
    max_model_len: int = 512
    kv_cache_bytes: int = 2**28
    seed: int = 0


class FrozenEngine(Protocol):
    """What a task uses of the engine it was given (the runner's `Engine` has all of it)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop `generate` runs on."""

    async def generate(
        self, prompt_ids: Sequence[int], *, max_tokens: int, temperature: float, stop_token_ids: Sequence[int] = ()
    ) -> Any:
        """One turn; the result has `token_ids`."""

    def shutdown(self) -> None:
        """Stop the engine and everything it started."""


#: Starts an engine serving a frozen model (given to `Environment.start` by the rollout service).
EngineMaker = Callable[[FrozenModel], FrozenEngine]
