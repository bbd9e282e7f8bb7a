"""Several proxies for pi_old measured in one run, beside the exact old log-probs of the fidelity shadow.

A regime map (how far each proxy is from pi_old as the per-version drift grows against the
train-inference discrepancy) needs every proxy measured on the same tokens of the same run. With
`fidelity_proxies=[...]` the shadow scores each named proxy on every training batch, while the run
trains with its own loss and reference (the exact routes make a stable control). Proxies:

- `async_recompute`: the trainer's current weights (pi_theta before the update);
- `linear_prox`, `loglinear_prox`: the interpolations between mu_old and pi_theta with
  alpha = 1/(n+1) for a token of version gap n (no weights of their own);
- `ewma`: a parameter average with beta = W/(W+2), W the largest version gap observed (0.6 at a
  gap cap of 3); `ewma_<beta>` (e.g. `ewma_0.75`): a fixed decay. Each average is its own (an
  `EWMAReference` callback), never reset: the paper compares decays without the reset.

Logged per proxy p, overall and per gap bucket: `fidelity/<p>/logratio_absmean|absmax` =
|log pi_p - log pi_old|, and `fidelity/<p>/mask_disagreement` = the fraction of tokens whose r_d mask
(`pi_p / mu_old` within the run loss's `discrepancy_bounds`) decides otherwise than with pi_old. Beside
them the shadow logs the train-inference discrepancy and the drift per version
(`fidelity/discrepancy_*`, `fidelity/version_drift_*`, `lit_asyncrl.fidelity`): their ratio places a
run on the map.
"""

from __future__ import annotations

import abc
import re

import lightning as L
import torch
from asyncrl_callbacks import EWMAReference

from lit_asyncrl.gap_stats import abs_stats_by_gap, fraction_by_gap
from lit_asyncrl.losses import LinearProx, LogLinearProx, LossInputs, LossStrategy
from lit_asyncrl.losses.discrepancy import masked_discrepancy_weight
from lit_asyncrl.scoring import logits_to_token_logprobs

#: The r_d mask bounds used when the run's loss has no mask of its own: the paper's (Table 4).
PAPER_DISCREPANCY_BOUNDS = (0.99, 1.01)


class PanelProxy(abc.ABC):
    """One proxy for pi_old, named as in `fidelity_proxies`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def callbacks(self) -> list[L.Callback]:
        return []

    @abc.abstractmethod
    def logprobs(self, batch: dict, inputs: LossInputs, version: int) -> torch.Tensor:
        """log pi_proxy [B, T] for the batch's tokens (no gradient)."""


class CurrentWeights(PanelProxy):
    """Async recompute: the weights being trained, before this step's update."""

    def logprobs(self, batch: dict, inputs: LossInputs, version: int) -> torch.Tensor:
        return inputs.logprobs.detach()


class Interpolation(PanelProxy):
    """The proximal policy of an interpolating loss (linear or log-linear in probability)."""

    def __init__(self, name: str, strategy: LossStrategy) -> None:
        super().__init__(name)
        self.strategy = strategy

    def logprobs(self, batch: dict, inputs: LossInputs, version: int) -> torch.Tensor:
        return self.strategy.proxy_logprobs(inputs)


class _MeasuredAverage(EWMAReference):
    """An EWMA that only stands in the shadow: it logs its decay alone (it never resets, so a streak
    and a reset count would say nothing), and does not warn that it is the live policy while W = 0
    (that warning is for a run's reference)."""

    def _warn_if_window_gives_zero_beta(self) -> None:
        return None

    def _log(self, pl_module: L.LightningModule, streak: int) -> None:
        pl_module.log(f"{self.log_prefix}ewma_beta", float(self.beta), batch_size=1)


class ParameterAverage(PanelProxy):
    """An EWMA of the parameters of its own, never reset; beta None = W/(W+2) from the observed gaps."""

    def __init__(self, name: str, beta: float | None) -> None:
        super().__init__(name)
        self.average = _MeasuredAverage(
            beta=beta,
            staleness_window="auto" if beta is None else None,
            module_attr="policy",
            patience=None,
            log_prefix=f"fidelity/{name}/",
        )

    def callbacks(self) -> list[L.Callback]:
        return [self.average]

    def logprobs(self, batch: dict, inputs: LossInputs, version: int) -> torch.Tensor:
        self.average.observe_version_gaps(inputs.version_gap[inputs.loss_mask])
        logits = self.average.reference_forward(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).logits
        return logits_to_token_logprobs(logits, batch["input_ids"], batch["temperature"], batch["top_k"])


_FIXED_DECAY = re.compile(r"ewma_(0?\.\d+)")


def make_proxy(name: str) -> PanelProxy:
    """The proxy called `name`; a ValueError naming `fidelity_proxies` for an unknown one."""
    if name == "async_recompute":
        return CurrentWeights(name)
    if name == "linear_prox":
        return Interpolation(name, LinearProx())
    if name == "loglinear_prox":
        return Interpolation(name, LogLinearProx())
    if name == "ewma":
        return ParameterAverage(name, beta=None)
    fixed = _FIXED_DECAY.fullmatch(name)
    if fixed and 0.0 < float(fixed.group(1)) < 1.0:
        return ParameterAverage(name, beta=float(fixed.group(1)))
    raise ValueError(
        f"fidelity_proxies: unknown proxy {name!r}; choose from async_recompute, linear_prox, loglinear_prox, "
        "ewma (beta = W/(W+2)) and ewma_<beta> with 0 < beta < 1 (e.g. ewma_0.75)"
    )


class ProxyPanel:
    """The named proxies, scored against exact pi_old on each training batch."""

    def __init__(self, names: list[str]) -> None:
        if len(set(names)) != len(names):
            raise ValueError(f"fidelity_proxies names a proxy twice: {list(names)}")
        self.proxies = [make_proxy(str(name)) for name in names]

    def callbacks(self) -> list[L.Callback]:
        return [callback for proxy in self.proxies for callback in proxy.callbacks()]

    def metrics(
        self,
        loss_fn: LossStrategy,
        inputs: LossInputs,
        exact: torch.Tensor,
        batch: dict,
        version: int,
        tokens: torch.Tensor,
    ) -> dict[str, float]:
        """`fidelity/<proxy>/*` over `tokens` (bool [B, T])."""
        bounds = getattr(loss_fn, "discrepancy_bounds", None) or PAPER_DISCREPANCY_BOUNDS
        behavior = inputs.behavior_logprobs
        exact_kept = masked_discrepancy_weight(exact, behavior, bounds)[1]
        metrics = {}
        for proxy in self.proxies:
            proxy_logprobs = proxy.logprobs(batch, inputs, version)
            distance = (proxy_logprobs - exact).abs()
            counted = tokens & torch.isfinite(distance)
            metrics.update(abs_stats_by_gap(distance, counted, inputs.version_gap, f"fidelity/{proxy.name}/logratio_"))
            proxy_kept = masked_discrepancy_weight(proxy_logprobs, behavior, bounds)[1]
            metrics.update(
                fraction_by_gap(
                    proxy_kept != exact_kept, counted, inputs.version_gap, f"fidelity/{proxy.name}/mask_disagreement"
                )
            )
        return metrics
