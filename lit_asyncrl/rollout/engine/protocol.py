"""The contract between the rollout side and an engine: what the producer, the episode runner and the
rollout service may ask of any engine, in this process (`engine.VLLMEngine`) or a Ray actor
(`ray_engine.RayEngine`).

Two threads talk to an engine. The trainer thread calls the lifecycle, weight and pause methods;
episodes run as asyncio tasks on the engine's `loop` and await `generate` there. `run` is how the
trainer thread waits on that loop: it raises `EngineDeadError`, naming the cause, as soon as the
engine cannot serve any more, so no caller blocks on a dead engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.rollout.weights.route import WeightPush

T = TypeVar("T")


class EngineDeadError(RuntimeError):
    """The vLLM engine (its loop thread or its engine-core process) is gone."""


class EngineStartTimeout(TimeoutError):
    """The engine did not serve within its start's time; its shutdown ends what the start made, and a new
    engine may be made in its place."""


@dataclasses.dataclass
class TurnOutput:
    """One generated turn: token ids, their behaviour log-probs mu and the version that sampled each."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str | None
    #: With `EngineSettings.capture_routing`, the experts each layer chose per weight version that computed
    #: part of the turn (a push in the turn's middle computes its positions again): version -> [positions,
    #: layers, top_k] (int16) from the request's first position, -1 where that version computed none.
    routed_experts: dict[int, torch.Tensor] | None = None


@runtime_checkable
class Engine(Protocol):
    """An engine that samples turns with a version on every token and takes weights as versions."""

    #: The version of the weights the engine samples with now (what a new token is tagged with).
    version: int

    def launch(self, initial_version: int = 0) -> None:
        """Start making the engine in the background, and return before it serves (`wait_until_serving`)."""

    def wait_until_serving(self, timeout_s: float = 300.0) -> None:
        """Block until the launched engine serves requests; raise if its start failed."""

    def start(self, initial_version: int = 0, timeout_s: float = 300.0) -> None:
        """`launch`, then `wait_until_serving`."""

    def shutdown(self, startup_timeout_s: float = 300.0) -> None:
        """Stop everything the engine started (processes, threads, temp dirs); safe to call twice."""

    def dead_reason(self) -> str | None:
        """Why the engine cannot serve any more, None while it is healthy."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop episodes run on (where `generate` is awaited)."""

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None, stalled: str | None = None) -> T:
        """Run `coroutine` on `loop` from another thread and wait for it (see `run_watched`)."""

    async def generate(
        self,
        prompt_ids: Sequence[int],
        *,
        max_tokens: int,
        temperature: float,
        top_k: int = -1,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
        on_tokens: Callable[[list[int], list[float]], None] | None = None,
    ) -> TurnOutput:
        """Sample one turn, streaming each piece to `on_tokens`; per-token mu and versions."""

    def push_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightPush:
        """Load `state_dict` in place by the engine's weight route and tag what follows `version`
        (a LoRA engine takes `state_dict` as the version's adapter); what the push took."""

    def pause(self) -> None:
        """Freeze generation, requests in flight kept, until `resume` (every piece streamed before
        the pause has reached its `on_tokens` when this returns)."""

    def resume(self) -> None:
        """Continue after `pause`."""


class EngineLoop:
    """What every engine implementation shares: the event loop its episodes run on (`_loop`, set
    when it starts) and `run` onto that loop, watched by the implementation's `dead_reason`."""

    _loop: asyncio.AbstractEventLoop | None = None
    #: Set once a call found the engine dead or not answering: its shutdown need not wait on it.
    _stopped_answering: bool = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the engine is not started; call start() first")
        return self._loop

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None, stalled: str | None = None) -> T:
        """Run a coroutine on the engine loop from another thread and wait for it (`run_watched`)."""
        try:
            return run_watched(self.loop, coroutine, self.dead_reason, timeout_s, stalled)
        except EngineDeadError:
            self._stopped_answering = True
            raise

    def dead_reason(self) -> str | None:
        raise NotImplementedError


def run_watched(
    loop: asyncio.AbstractEventLoop,
    coroutine: Coroutine[Any, Any, T],
    dead_reason: Callable[[], str | None],
    timeout_s: float | None = None,
    stalled: str | None = None,
) -> T:
    """`coroutine` on `loop` (another thread's), waited for while `dead_reason()` stays None.

    Raises `EngineDeadError` within about a second if the engine dies while waiting, and in place of
    whatever a dead engine's call raised (vLLM's own errors name no part). With `stalled` (what the
    call is, e.g. "a weight push"), running past `timeout_s` means the engine stopped answering
    (`EngineDeadError`); without it, a plain `TimeoutError`.
    """
    future = asyncio.run_coroutine_threadsafe(coroutine, loop)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        wait_s = 1.0 if deadline is None else min(1.0, max(deadline - time.monotonic(), 0.0))
        try:
            return future.result(wait_s)
        except concurrent.futures.TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                future.cancel()
                if stalled:
                    raise EngineDeadError(
                        f"the vLLM engine stopped answering: {stalled} got no answer within {timeout_s:g} s "
                        f"({config_key('rollout.engine_stall_timeout_s')})"
                    ) from None
                raise TimeoutError(f"the vLLM engine did not answer within {timeout_s} s") from None
            error = None
        except Exception as raised:
            error = raised
        reason = dead_reason()
        if reason is not None:
            future.cancel()
            raise EngineDeadError(f"the vLLM engine died: {reason}") from error
        if error is not None:
            raise error


async def cancel_other_tasks() -> None:
    """Cancel every task of the running loop but the caller's and wait for them to end: an engine's
    episodes end at its shutdown, not in a `__del__` at interpreter exit."""
    pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
