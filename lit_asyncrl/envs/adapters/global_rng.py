"""Isolation for libraries that draw from (or reseed) the process-global random generators.

gem and reasoning-gym call `random.seed` / `numpy.random.seed` on reset and draw from the global
`random` module. Sync episode calls run concurrently in a thread pool, so two episodes would
corrupt each other's randomness. `GlobalRandomState` gives each episode its own saved copy of both
global states: `with state.active():` takes the process-wide `LIBRARY_LOCK` (one library call at a
time, across every adapter), installs the episode's states, and on the way out saves them back
and restores whatever the process had before. An episode's draws then depend only on its own
calls, never on how the calls of other episodes interleave, and code outside the adapters sees the
global generators untouched.

Limit: a thread that is not an adapter (and so does not take the lock) and draws from the global
`random` / `numpy.random` while an adapter call is running would draw from the episode's state.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator
from typing import Any

try:
    import numpy as _np
except ImportError:  # pragma: no cover - both libraries depend on numpy
    _np = None

#: Serialises every call into a library that touches the global generators (all adapters share it).
LIBRARY_LOCK = threading.RLock()


@contextlib.contextmanager
def preserved_global_random() -> Iterator[None]:
    """Hold `LIBRARY_LOCK`; on the way out put back the global states the process had.

    For calls that reseed the generators before drawing (gem's `reset(seed)`), where an episode's
    own state is not needed.
    """
    with LIBRARY_LOCK:
        outer_python = random.getstate()
        outer_numpy = _np.random.get_state() if _np is not None else None
        try:
            yield
        finally:
            random.setstate(outer_python)
            if _np is not None:
                _np.random.set_state(outer_numpy)


class GlobalRandomState:
    """A private copy of the global `random` and `numpy.random` states, seeded from `seed` on first use.

    Each `active()` costs about 0.25 ms (numpy's state is copied in and out), small next to a turn
    of generation.
    """

    def __init__(self, seed: int | None = 0) -> None:
        self.seed = seed
        self._python: Any = None
        self._numpy: Any = None

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Hold `LIBRARY_LOCK` with this state installed as the process-global one."""
        with preserved_global_random():
            if self._python is None:
                random.seed(self.seed)
                if _np is not None:
                    _np.random.seed(None if self.seed is None else self.seed % 2**32)
            else:
                random.setstate(self._python)
                if _np is not None:
                    _np.random.set_state(self._numpy)
            try:
                yield
            finally:
                self._python = random.getstate()
                if _np is not None:
                    self._numpy = _np.random.get_state()
