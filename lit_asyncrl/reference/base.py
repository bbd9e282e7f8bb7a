"""The reference-source protocol."""

from __future__ import annotations

from typing import Protocol

import lightning as L
import torch


class ReferenceSource(Protocol):
    """Gives pi_ref log-probs [B, T] for a batch, or None (the loss then anchors on mu).

    A source that keeps state across steps (snapshots, an EWMA) does it in a Lightning callback,
    which `callbacks()` hands to the module's `configure_callbacks`.
    """

    #: True when pi_ref is the exact training-side log-prob of each token's own version.
    exact: bool

    def callbacks(self) -> list[L.Callback]: ...

    def ref_logprobs(self, module: L.LightningModule, batch: dict, current_logprobs: torch.Tensor) -> torch.Tensor | None:
        """`current_logprobs` [B, T] are pi_theta's (detached); sources may reuse them."""
        ...
