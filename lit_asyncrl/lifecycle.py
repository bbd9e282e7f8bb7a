"""Every way out of a run goes through the same cleanup: SIGTERM becomes an exception.

Lightning turns Ctrl-C (SIGINT) into a graceful shutdown and calls the datamodule's and the
callbacks' `on_exception`, where the rollout service closes. SIGTERM, by default, only sets a flag
that Lightning checks between steps, so a trainer waiting for a batch would not notice it. Inside
`sigterm_raises()` SIGTERM raises `Terminated` at once, wherever the main thread is, and the run
unwinds like any other failure.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings
from collections.abc import Iterator


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM; exits with status 143 (128 + SIGTERM) if not caught."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated` (no-op outside the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def quiet_known_warnings() -> None:
    """Silence warnings about choices made on purpose, so the console shows what matters.

    `training_step(dataloader_iter)` is deliberate (no prefetch: a prefetched batch would be one
    version staler); Lightning warns about that signature at every fit. The held-out evaluation is an
    IterableDataset with a length (its chunks, for the progress bar) read in this process only.
    """
    warnings.filterwarnings("ignore", message=r".*`dataloader_iter`.*")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=r".*`IterableDataset` has `__len__` defined.*")
