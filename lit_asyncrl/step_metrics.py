"""Step metrics read off a training batch: a dataset task's reward functions, and the gap between the
reference's log-probs and the engine's."""

from __future__ import annotations

import torch

from lit_asyncrl.gap_stats import abs_stats_by_gap
from lit_asyncrl.rollout.records import REWARD_FAILED, REWARD_VALUE


def reward_terms(batch: dict) -> dict[str, float]:
    """A dataset task's reward functions over this process's episodes of the batch (under DDP, rank
    0's share): `train/rewards/<name>` the mean value where it scored, `.../scored` the share of
    episodes it scored, `.../failed` the share it raised on. Empty for other tasks."""
    metrics = {}
    for key, values in batch.items():
        if not key.startswith(REWARD_VALUE):
            continue
        name = key.removeprefix(REWARD_VALUE)
        scored = ~torch.isnan(values)  # [B]
        if scored.any():
            metrics[f"train/rewards/{name}"] = float(values[scored].mean())
        metrics[f"train/rewards/{name}/scored"] = float(scored.double().mean())
        metrics[f"train/rewards/{name}/failed"] = float((batch[f"{REWARD_FAILED}{name}"] > 0).double().mean())
    return metrics


def reference_gap_metrics(
    ref_logprobs: torch.Tensor | None,
    behavior_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    version_gap: torch.Tensor,
) -> dict[str, float]:
    """|log pi_ref - log mu| on scored policy tokens: the train-inference gap the reference sees,
    overall and per version gap (`.../gap_0` ... `.../gap_3`, `.../gap_4plus`).

    With an exact reference, pi_ref is pi_old at each token's own version, so this is the
    training-inference discrepancy alone: numerical noise at every gap with an fp32 engine, the
    paper's gap with a bf16 one. Unscored (non-finite) tokens are left out here and counted by
    the loss instead.
    """
    if ref_logprobs is None:
        return {}
    log_rd = (ref_logprobs - behavior_logprobs).abs()
    return abs_stats_by_gap(log_rd, loss_mask & torch.isfinite(log_rd), version_gap, "train/ref_behavior_logratio_")
