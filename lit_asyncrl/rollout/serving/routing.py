"""Which engine starts the next advantage group: the least loaded one."""

from __future__ import annotations

from collections.abc import Callable


class LeastLoadedRouter:
    """Admits a new group only on an engine with the fewest groups in flight (ties admit all tied).

    Every engine's producer asks before it reserves buffer room for a group, so a free slot in the
    buffer goes to whichever engine is least busy; an engine that answers faster finishes its groups
    sooner and so gets more of them. A group (and so each of its multi-turn episodes) stays on the
    engine that started it: its KV cache and its per-token versions belong to that engine.
    """

    def __init__(self) -> None:
        self._loads: dict[int, Callable[[], int]] = {}

    def register(self, engine_index: int, load: Callable[[], int]) -> None:
        """`load()` = groups engine `engine_index` has in flight now (read from any thread)."""
        self._loads[engine_index] = load

    def admits(self, engine_index: int) -> bool:
        loads = {index: load() for index, load in list(self._loads.items())}
        return loads[engine_index] <= min(loads.values())

    def loads(self) -> list[int]:
        return [self._loads[index]() for index in sorted(self._loads)]
