"""PPO-EWMA: a debiased EWMA of the policy parameters as the proximal reference (paper 5.2)."""

from __future__ import annotations

from typing import Literal

import lightning as L
import torch
from asyncrl_callbacks import EWMAReference

from lit_asyncrl.models.moe_routing import applied, batch_routing_of
from lit_asyncrl.reference.base import ReferenceSource
from lit_asyncrl.scoring import logits_to_token_logprobs


class EWMAReferenceSource(ReferenceSource):
    """pi_prox from theta_prox = sum_k beta^(t-k) theta_k / sum_k beta^(t-k), with auto-reset.

    The average starts from the weights the RL fit starts with (after any warm start, which runs
    as its own phase before the fit).

    Args:
        beta: EWMA decay; None derives it from the staleness window as W / (W + 2): 0.6 at a
            version-gap cap of 3, and 0 when W = 0. With "auto", W = 0 while every observed gap is 0,
            i.e. for the whole run with synchronous rollouts: the reference is then the live policy
            (pi_ref = pi_theta after every update); the callback warns once when this happens.
        staleness_window: W, or "auto" to take it from the observed version gaps (their running max;
            W = 2 until the first is observed).
        tau, patience: reset theta_prox to theta after `patience` consecutive steps with
            `train/train_infer_mask` below `tau`; patience None disables the reset. tau = 0.8 is one
            of the paper's values; patience = 3 is this library's choice (the paper gives none).
    """

    def __init__(
        self,
        beta: float | None = None,
        staleness_window: float | Literal["auto"] | None = "auto",
        tau: float = 0.8,
        patience: int | None = 3,
    ) -> None:
        if beta is not None and not 0.0 < beta < 1.0:
            # beta 0 would make pi_prox the current weights: r_s = 1, the PPO clip a no-op.
            raise ValueError(
                f"reference.beta must be in (0, 1) or null (derived from the staleness window), got {beta}"
            )
        self.beta = beta
        self.staleness_window = staleness_window
        self.tau = tau
        self.patience = patience
        self._ewma = EWMAReference(
            beta=beta,
            staleness_window=None if beta is not None else staleness_window,
            module_attr="policy",
            tau=tau,
            patience=patience,
        )

    @property
    def may_equal_current(self) -> bool:  # type: ignore[override]  # a ClassVar on the base
        """At the step after an automatic reset (or the first step) the average is the live weights: r_s == 1 by
        design."""
        return self._ewma.holds_only_live_weights

    def callbacks(self) -> list[L.Callback]:
        return [self._ewma]

    @torch.no_grad()
    def ref_logprobs(self, batch: dict, current_logprobs: torch.Tensor, version: int) -> torch.Tensor:
        loss_mask = batch["loss_mask"]
        self._ewma.observe_version_gaps((version - batch["versions"])[loss_mask])
        with applied(batch_routing_of(batch)):  # an MoE's routers follow the engine's routing
            logits = self._ewma.reference_forward(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).logits
        return logits_to_token_logprobs(logits, batch["input_ids"], batch["temperature"], batch["top_k"])
