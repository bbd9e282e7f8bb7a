"""The reference-source base class: where the decoupled loss gets pi_ref."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar

import lightning as L
import torch

if TYPE_CHECKING:
    from lit_asyncrl.rollout.service import RolloutService


class ReferenceSource(abc.ABC):
    """Gives pi_ref log-probs [B, T] for a batch, or None (the loss then anchors on mu).

    A base class rather than a Protocol so that the Lightning CLI takes any subclass as
    `class_path` + `init_args` (and Hydra as `_target_`). A source that keeps state across steps
    (snapshots, an EWMA) does it in Lightning callbacks, which `callbacks()` hands to the module's
    `configure_callbacks`; a source that needs the rollout service gets it through `bind`.
    """

    #: True when pi_ref is the exact training-side log-prob of each token's own version.
    exact: ClassVar[bool] = False
    #: True when pi_ref may equal the current weights by design at some steps (the module's warning
    #: about a reference that is silently the current policy then stays quiet).
    may_equal_current: ClassVar[bool] = False
    #: True when pi_ref comes from forwards in the training step, over the batch (where an MoE's
    #: forwards can follow the batch's routing, `model.routing_replay`); False when it was scored before.
    scores_in_the_step: ClassVar[bool] = True

    def callbacks(self) -> list[L.Callback]:
        return []

    def bind(self, rollouts: RolloutService | None) -> None:
        """Called once per fit, by the module's `setup` (after the datamodule's and the callbacks'
        set-up, before training starts), with the datamodule's rollout service, or None when the
        datamodule has none (ready-made batches). Check what the source needs of the service and
        keep it; most sources need nothing."""
        return None

    def check_rollout_settings(self, rollouts: RolloutService) -> None:
        """Refuse rollout settings this source cannot serve (a staleness cap beyond what it keeps,
        a service that cannot host what it needs); called before the warm start and the engines,
        so a bad combination costs nothing. Most sources serve any: nothing to check."""
        return None

    @abc.abstractmethod
    def ref_logprobs(self, batch: dict, current_logprobs: torch.Tensor, version: int) -> torch.Tensor | None:
        """pi_ref for `batch` [B, T].

        Args:
            batch: the training batch (schema in `lit_asyncrl.rollout.service`).
            current_logprobs: [B, T] the live weights' log-probs with dropout off (as the references
                score), detached; sources may reuse them.
            version: the trainer's weight version (optimizer steps taken).
        """

    def __repr__(self) -> str:
        arguments = ", ".join(f"{key}={value!r}" for key, value in vars(self).items() if not key.startswith("_"))
        return f"{type(self).__name__}({arguments})"
