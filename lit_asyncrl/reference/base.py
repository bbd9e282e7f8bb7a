"""The reference-source protocol."""

from __future__ import annotations

from typing import Protocol

import torch


class ReferenceSource(Protocol):
    """Gives pi_ref log-probs [B, T] for a batch, or None (the loss then anchors on mu)."""

    #: True when pi_ref is the exact training-side log-prob of each token's own version.
    exact: bool

    def ref_logprobs(self, module: torch.nn.Module, batch: dict) -> torch.Tensor | None: ...
