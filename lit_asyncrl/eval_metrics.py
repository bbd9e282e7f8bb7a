"""avg@k, pass@k and pass^k over held-out instances, as torchmetrics metrics (sum states: exact under DDP).

With n sampled episodes per instance of which c succeed:
- avg@k is the expected success of one sample, estimated by c / n (the same for every k <= n);
- pass@k is the probability that at least one of k samples succeeds, estimated without bias by
  1 - C(n - c, k) / C(n, k) (Chen et al., 2021), not by the biased 1 - (1 - c/n)^k;
- pass^k is the probability that all k samples succeed (tau-bench's reliability measure, as tau2
  reports it), estimated without bias by C(c, k) / C(n, k).
Each is averaged over instances.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torchmetrics import MeanMetric, Metric


def pass_at_k(successes: torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased pass@k of each row of `successes` [N, n] (0/1 values, n >= k); returns [N].

    1 - C(n-c, k)/C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i), the numerically stable product form.
    """
    n = successes.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n samples, got k={k}, n={n}")
    failures = (n - successes.sum(dim=-1)).long()  # n - c
    values = []
    for failed in failures.tolist():
        if failed < k:  # fewer failures than draws: some success is always drawn
            values.append(1.0)
            continue
        i = torch.arange(failed + 1, n + 1, dtype=torch.float64)
        values.append(float(1.0 - torch.prod(1.0 - k / i)))
    return torch.tensor(values, dtype=torch.float64)


def pass_hat_k(successes: torch.Tensor, k: int) -> torch.Tensor:
    """Unbiased pass^k of each row of `successes` [N, n] (0/1 values, n >= k); returns [N].

    C(c, k)/C(n, k) = prod_{i=0}^{k-1} (c - i)/(n - i), which is 0 as soon as c < k.
    """
    n = successes.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"pass^k needs 1 <= k <= n samples, got k={k}, n={n}")
    succeeded = successes.sum(dim=-1).double().unsqueeze(-1)  # c, as a column
    i = torch.arange(k, dtype=torch.float64)
    return torch.prod((succeeded - i).clamp(min=0.0) / (n - i), dim=-1)


class _InstanceMean(Metric):
    """Mean over instances of a per-instance value, with summed states."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("instances", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _add(self, per_instance: torch.Tensor) -> None:
        self.total += per_instance.to(self.total).sum()
        self.instances += per_instance.numel()

    def compute(self) -> torch.Tensor:
        return (self.total / self.instances.clamp(min=1)).float()


class AvgAtK(_InstanceMean):
    """avg@k: mean success over the samples of each instance, then over instances."""

    def update(self, successes: torch.Tensor) -> None:
        self._add(successes.double().mean(dim=-1))


class _OfKSamples(_InstanceMean):
    """A per-instance estimate over k of the n samples (`estimate(successes, k)`), averaged over instances."""

    estimate: Callable[[torch.Tensor, int], torch.Tensor]

    def __init__(self, k: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.k = k

    def update(self, successes: torch.Tensor) -> None:
        self._add(type(self).estimate(successes, self.k))


class PassAtK(_OfKSamples):
    """pass@k with the unbiased estimator, averaged over instances."""

    estimate = staticmethod(pass_at_k)


class PassHatK(_OfKSamples):
    """pass^k (every one of k samples succeeds) with the unbiased estimator, averaged over instances."""

    estimate = staticmethod(pass_hat_k)


class HeldOutMetrics(torch.nn.Module):
    """avg@k, pass@k, pass^k and greedy success of a validation, overall and per task of a mixture.

    `update` takes one chunk of held-out instances: `success` [N, n] (n sampled episodes each),
    `greedy_success` [N] and, for a mixture, `task_ids` [N] indexing `task_names`. Every rank
    builds the same metrics from the same names, so their states sync under DDP.
    """

    def __init__(self, k: int, task_names: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.k = k
        self.task_names = tuple(task_names)
        # "all" for every instance, "task_<name>" for a task's (the prefix keeps a task named "all" apart).
        self.groups = torch.nn.ModuleDict(
            {
                name: torch.nn.ModuleDict(
                    {"avg": AvgAtK(), "pass": PassAtK(k), "pass_hat": PassHatK(k), "greedy": MeanMetric()}
                )
                for name in ("all", *(f"task_{task}" for task in self.task_names))
            }
        )

    def attributes(self, prefix: str) -> dict[int, str]:
        """Each metric's attribute path from the module that holds this one as `prefix`, by the metric's id
        (what `LightningModule.log` takes as `metric_attribute`)."""
        return {id(metric): f"{prefix}.{path}" for path, metric in self.named_modules() if isinstance(metric, Metric)}

    def _key(self, group: str, metric: str) -> str:
        prefix = "val/" if group == "all" else f"val/{group.removeprefix('task_')}/"
        names = {
            "avg": f"avg@{self.k}",
            "pass": f"pass@{self.k}",
            "pass_hat": f"pass^{self.k}",
            "greedy": "greedy_success",
        }
        return prefix + names[metric]

    def update(
        self, success: torch.Tensor, greedy_success: torch.Tensor, task_ids: torch.Tensor | None = None
    ) -> dict[str, tuple[Metric, int]]:
        """Add one chunk; returns the metrics it updated by their logged names (`val/avg@4`,
        `val/<task>/pass@4`, ...) with the number of instances each took, for `LightningModule.log`."""
        updated = {}
        for group, metrics in self.groups.items():
            rows = torch.ones_like(greedy_success, dtype=torch.bool)
            if group != "all":
                rows = task_ids == self.task_names.index(group.removeprefix("task_"))
            count = int(rows.sum())
            if count == 0:
                continue
            metrics["avg"].update(success[rows])
            metrics["pass"].update(success[rows])
            metrics["pass_hat"].update(success[rows])
            metrics["greedy"].update(greedy_success[rows])
            updated.update({self._key(group, name): (metric, count) for name, metric in metrics.items()})
        return updated

    def compute(self) -> dict[str, float]:
        """Every metric's value so far, by logged name (tasks without instances left out)."""
        values = {}
        for group, metrics in self.groups.items():
            if group == "all" or int(metrics["avg"].instances) > 0:
                values.update({self._key(group, name): float(metric.compute()) for name, metric in metrics.items()})
        return values
