"""Every way out of a run goes through the same cleanup: SIGTERM becomes an exception.

Lightning turns Ctrl-C (SIGINT) into a graceful shutdown and calls the datamodule's and the
callbacks' `on_exception`, where the rollout service closes. SIGTERM, by default, only sets a flag
that Lightning checks between steps, so a trainer waiting for a batch would not notice it. Inside
`sigterm_raises()` SIGTERM raises `Terminated` at once, wherever the main thread is, and the run
unwinds like any other failure.

Lightning installs a SIGTERM handler of its own at the start of each fit, with ours chained after
it. Under DDP that handler forwards the signal to the other ranks and broadcasts a flag over the
process group from inside the handler, where it can meet a collective another rank is blocked in
(the batch scatter) and hang both; a rank that exits on the forwarded signal also makes Lightning's
child watcher SIGKILL rank 0 in the middle of its cleanup. `SigtermStaysOurs` puts our handler
back once Lightning has installed its own: rank 0 unwinds and closes the engines, then ends the
ranks Lightning started (`end_other_ranks`), as Lightning itself does on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import warnings
from collections.abc import Iterator

import lightning as L
from typing_extensions import override


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


class SigtermStaysOurs(L.Callback):
    """Inside `sigterm_raises()`, replaces the SIGTERM handler Lightning installs at fit start with
    ours again (see the module docstring); elsewhere it does nothing. Lightning restores the
    handler it found (ours) when the fit ends."""

    # Lightning registers its handler just before the stage runs: these are the first hooks after.
    @override
    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _take_sigterm_back()

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _take_sigterm_back()

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        _take_sigterm_back()


def end_other_ranks(trainer: L.Trainer | None) -> None:
    """On rank 0, after its cleanup: SIGKILL the training processes Lightning started, and wait for them.

    They hold no engine (rank 0 hosts them all) and are usually blocked in a collective waiting
    for rank 0, where no signal handler runs; left alone they would die when rank 0's connections
    close, each printing gloo's "Connection closed by peer" traceback. Lightning's child watcher
    thread SIGKILLs this process when a rank it started ends with a non-zero code, so it is told
    first that there are no ranks left to watch.
    """
    launcher = trainer.strategy.launcher if trainer is not None else None
    processes = list(getattr(launcher, "procs", None) or [])
    if not processes:
        return
    for thread in threading.enumerate():
        if thread.name == "child-process-observer":
            thread._child_processes = []
    for process in processes:
        process.kill()
    for process in processes:
        process.wait(timeout=30)


def _take_sigterm_back() -> None:
    if threading.current_thread() is threading.main_thread() and _chained_after_lightning(
        signal.getsignal(signal.SIGTERM)
    ):
        signal.signal(signal.SIGTERM, _raise_terminated)


def _chained_after_lightning(handler: object) -> bool:
    """Whether `handler` is Lightning's composition of its handler with ours."""
    return _raise_terminated in getattr(handler, "signal_handlers", ())


def finish_wandb_run() -> None:
    """End the W&B run that `logger=wandb` opened, however the run ended. Lightning leaves it open: the
    next job of a Hydra multirun (the same process) would log into it, and W&B's import hooks would
    stay installed, so a process forked later (a test's ranks) wrote to the run's closed socket."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish()


def quiet_known_warnings() -> None:
    """Silence warnings about choices made on purpose, so the console shows what matters.

    `training_step(dataloader_iter)` is deliberate (no prefetch: a prefetched batch would be one
    version staler); Lightning warns about that signature at every fit. The held-out evaluation is an
    IterableDataset with a length (its chunks, for the progress bar) read in this process only.
    Lightning's CSV logger's note that the run dir is not empty is replaced by a precise warning
    (`before_fit.warn_of_replaced_metrics`). Lightning's tip advertising its cloud logger is dropped too (runs log to
    CSV on purpose), and transformers' bar for loading a model's weights (a run loads its small policy several times:
    the module, the warm start, the references; Lightning's own bar is the one to watch).
    """
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=r".*`dataloader_iter`.*")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=r".*`IterableDataset` has `__len__` defined.*")
    # The RL log shares its run dir with Hydra's files and the warm start's log, so Lightning's CSV
    # logger always finds the dir "not empty"; it only replaces a metrics.csv already there, which
    # `before_fit.check_settings` names itself.
    warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty.*")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_LITLOGGER_TIP)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_OWN_BAR_NOTE)


class _NoLitLoggerTip(logging.Filter):
    """Drops the advertisement for Lightning's cloud logger that every `Trainer` logs at its start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


class _NoOwnBarNote(logging.Filter):
    """Drops Lightning's note that the module's callbacks replace the trainer's when all they replace is
    Lightning's default rich bar: the module puts its phase bar in its place on purpose
    (`progress_bar.stream_progress_bar`). A note naming any other callback is kept."""

    OWN_BAR_NOTE = (
        "The following callbacks returned in `LightningModule.configure_callbacks` will override existing callbacks "
        "passed to Trainer: RichProgressBar"
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.OWN_BAR_NOTE


_LITLOGGER_TIP = _NoLitLoggerTip()
_OWN_BAR_NOTE = _NoOwnBarNote()
