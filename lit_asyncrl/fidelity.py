"""Reference fidelity: exact old log-probs computed in the shadow of any reference, and how far the
reference a run actually uses is from them.

With `fidelity=true` (Hydra) or `--model.fidelity true` (Lightning CLI) the module keeps weight
snapshots of its own, scores every policy token under the version that sampled it (exact
`log pi_old`) and logs, overall and per version-gap bucket n:

- `fidelity/logratio_absmean/gap_n`, `fidelity/logratio_absmax/gap_n`: |log pi_proxy - log pi_old|,
  where pi_proxy is what the loss strategy puts in pi_old's place: the reference source's pi_ref
  (EWMA, async recompute, or an exact route), the interpolated pi_prox of `linear_prox` and
  `loglinear_prox`, or mu_old for strategies without a reference (`ppo_clip_train_infer`);
- `fidelity/mask_disagreement/gap_n`: the fraction of those tokens whose train-infer mask decision
  differs from the decision the same strategy makes with exact pi_old (strategies without an r_d
  mask log no disagreement);
- `fidelity/discrepancy_absmean|absmax` (and per gap): |log pi_old - log mu_old|, the train-inference
  discrepancy, and `fidelity/version_drift_absmean|absmax`: |log pi_v - log pi_(v-1)| on the batch's
  tokens, how far one version moves the policy. Their ratio is the run's regime (where proxies of
  pi_old can live), stated by each run that has the shadow rather than borrowed from other runs.

The training itself is unchanged: the shadow only measures. It costs one snapshot per version, one
extra forward per distinct stale version in a batch and one under the previous version (the drift).
With `fidelity_proxies` it also measures other proxies on the same tokens (`lit_asyncrl.fidelity_panel`).
"""

from __future__ import annotations

import lightning as L
import torch
from asyncrl_callbacks import SnapshotRetention
from typing_extensions import override

from lit_asyncrl.fidelity_panel import ProxyPanel
from lit_asyncrl.gap_stats import abs_stats_by_gap, fraction_by_gap
from lit_asyncrl.losses import LossInputs, LossStrategy
from lit_asyncrl.reference.snapshot import SnapshotReference
from lit_asyncrl.rollout.service import RolloutService


class _ShadowRetention(SnapshotRetention):
    """Snapshots of their own, checkpointed under their own key, logging no `snapshot/*` metrics
    (those describe the run's reference, which may be a snapshot reference too)."""

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(role="fidelity_shadow", module_attr=self.module_attr)


class _ShadowSnapshots(SnapshotReference):
    """A snapshot reference whose snapshots are the shadow's own (`_ShadowRetention`)."""

    def make_retention(self) -> SnapshotRetention:
        return _ShadowRetention(max_staleness=None, module_attr="policy", log_metrics=False)


class ReferenceFidelity:
    """Exact old log-probs beside the run's reference, and the per-gap distances to them.

    Args:
        proxies: other proxies to measure beside the run's own (`fidelity_panel.make_proxy` names).
        fallback_window: versions kept behind the newest when training without a rollout service
            (with one, the shadow follows its staleness cap and frees versions no token refers to).
    """

    def __init__(self, proxies: list[str] | tuple[str, ...] = (), fallback_window: int = 8) -> None:
        self.exact: SnapshotReference = _ShadowSnapshots()
        self.panel = ProxyPanel(list(proxies)) if proxies else None
        self.fallback_window = fallback_window

    def callbacks(self) -> list[L.Callback]:
        return [self.exact.retention, *(self.panel.callbacks() if self.panel is not None else [])]

    def bind(self, rollouts: RolloutService | None) -> None:
        """Follow the rollout service's staleness cap and live versions (called once per fit by the
        module, like `ReferenceSource.bind`); without one (a DataModule of ready-made batches) keep
        the last `fallback_window` versions."""
        if rollouts is not None:
            self.exact.bind(rollouts)
        else:
            self.exact.retention.set_max_staleness(self.fallback_window)

    def metrics(
        self,
        loss_fn: LossStrategy,
        inputs: LossInputs,
        applied_mask: torch.Tensor,
        batch: dict,
        version: int,
        live_logprobs: torch.Tensor,
    ) -> dict[str, float]:
        """The `fidelity/*` metrics of one training batch.

        Args:
            loss_fn: the run's strategy (it knows which proxy it uses and how it masks).
            inputs: the inputs the strategy was called with ([B, T] each).
            applied_mask: the r_d mask the strategy applied (`LossOutput.discrepancy_mask`).
            batch: the training batch (token ids and versions for the historical forwards).
            version: the trainer's weight version.
            live_logprobs: [B, T] the live weights' log-probs with dropout off (the module's
                `live_logprobs_without_dropout`): the newest version's exact scores and the drift's end.
        """
        with torch.no_grad():
            # Before the exact scores, which release the versions no live token refers to: v-1 is held until then.
            drift = self._version_drift(batch, inputs, version, live_logprobs)
            exact = self.exact.ref_logprobs(batch, live_logprobs.detach(), version)
            finite = _finite(inputs)
            metrics = fidelity_metrics(
                proxy_logprobs=loss_fn.proxy_logprobs(inputs),
                exact_logprobs=exact,
                loss_mask=inputs.loss_mask,
                version_gap=inputs.version_gap,
                applied_mask=applied_mask,
                exact_mask=loss_fn.discrepancy_mask_under(inputs, exact),
                finite=finite,
            )
            tokens = inputs.loss_mask & finite & torch.isfinite(exact)
            discrepancy = (exact - inputs.behavior_logprobs).abs()
            metrics.update(abs_stats_by_gap(discrepancy, tokens, inputs.version_gap, "fidelity/discrepancy_"))
            if drift is not None and (counted := tokens & torch.isfinite(drift)).any():
                metrics["fidelity/version_drift_absmean"] = drift[counted].mean().item()
                metrics["fidelity/version_drift_absmax"] = drift[counted].max().item()
            if self.panel is not None:
                metrics.update(self.panel.metrics(loss_fn, inputs, exact, batch, version, tokens))
            return metrics

    def _version_drift(
        self, batch: dict, inputs: LossInputs, version: int, live_logprobs: torch.Tensor
    ) -> torch.Tensor | None:
        """|log pi_v - log pi_(v-1)| [B, T] on the batch's policy tokens: how far the last update moved
        the policy (the regime map's drift per version, whatever the batch's version gaps). None at
        version 0, and when v-1 is not held (the shadow keeps it until this step's exact scores)."""
        previous = version - 1
        if previous < 0 or not self.exact.retention.has_version(previous):
            return None
        current = live_logprobs.detach()
        at_previous = torch.where(inputs.loss_mask, previous, batch["versions"])
        # An MoE's forwards both follow each position's newest routing: the drift of the weights alone.
        previous_logprobs = self.exact.logprobs_under(batch, at_previous, current, routing_of_versions=False)
        return (current - previous_logprobs).abs()


def fidelity_metrics(
    proxy_logprobs: torch.Tensor,
    exact_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    version_gap: torch.Tensor,
    applied_mask: torch.Tensor,
    exact_mask: torch.Tensor | None,
    finite: torch.Tensor | None = None,
) -> dict[str, float]:
    """`fidelity/logratio_abs{mean,max}[/gap_n]` and `fidelity/mask_disagreement[/gap_n]` ([B, T] inputs).

    Tokens counted: policy tokens (`loss_mask`) whose log-ratio is finite and, when given, where
    `finite` holds (the loss's own inputs were finite there).
    """
    log_ratio = (proxy_logprobs - exact_logprobs).abs()
    tokens = loss_mask & torch.isfinite(log_ratio)
    if finite is not None:
        tokens = tokens & finite
    metrics = abs_stats_by_gap(log_ratio, tokens, version_gap, "fidelity/logratio_")
    if exact_mask is not None:
        metrics.update(fraction_by_gap(applied_mask != exact_mask, tokens, version_gap, "fidelity/mask_disagreement"))
    return metrics


def _finite(inputs: LossInputs) -> torch.Tensor:
    finite = torch.isfinite(inputs.logprobs.detach()) & torch.isfinite(inputs.behavior_logprobs)
    return finite & torch.isfinite(inputs.advantages)
