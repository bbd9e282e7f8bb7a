"""Calls into environments from the engine's event loop without ever blocking it."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class EnvCaller:
    """Awaits an environment method, whatever its kind.

    An `async def` method is awaited on the loop itself (it yields while its tool waits). A plain
    method runs in a thread pool with one worker per concurrent episode, so a slow synchronous tool
    holds one worker, never the loop that streams every other episode's tokens.

    Args:
        max_workers: threads for synchronous environment calls (the most episodes in flight).
    """

    def __init__(self, max_workers: int) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="lit-asyncrl-env")

    async def __call__(self, method: Callable[..., Any], *args: Any) -> Any:
        if inspect.iscoroutinefunction(method):
            return await method(*args)
        result = await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(method, *args))
        # A plain method may still return an awaitable (e.g. a wrapper around a coroutine function).
        return await result if inspect.isawaitable(result) else result

    def close(self) -> None:
        """Drop queued calls; calls already running finish on their threads (Python cannot stop them)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
