"""The progress bar of a fit on an endless stream of batches.

Lightning's rich bar names its line "Epoch <e>/<max_epochs - 1>": with `max_epochs=-1` (a stream has
no epochs; `max_steps` ends the fit) that reads "Epoch 0/-2". This bar names the phase instead.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE
from typing_extensions import override


class PhaseProgressBar(RichProgressBar):
    """Lightning's rich progress bar with its training line named `phase` ("RL", "Warm start")."""

    def __init__(self, phase: str) -> None:
        super().__init__()
        self.phase = phase

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        # Padded like Lightning's own description, so the bar does not flicker against "Validation".
        return f"{self.phase:{max(len(self.phase), len(self.validation_description))}}"


def stream_progress_bar(phase: str, trainer: L.Trainer | None = None, enabled: bool = True) -> list[L.Callback]:
    """The bar for a fit on a stream, as a callbacks list: `PhaseProgressBar` in place of Lightning's
    default rich bar (the one `trainer` has, when given), and nothing where the bar is off, rich is
    not installed (Lightning's tqdm bar never shows the epoch count) or the trainer has a bar of the
    user's own choosing."""
    if not enabled or not _RICH_AVAILABLE:
        return []
    if trainer is not None and type(trainer.progress_bar_callback) is not RichProgressBar:
        return []
    return [PhaseProgressBar(phase)]
