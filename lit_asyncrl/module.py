"""The LightningModule: the policy, a loss strategy and a reference source."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch

from lit_asyncrl.losses import LossInputs, get_loss
from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.reference import build_reference
from lit_asyncrl.scoring import logits_to_token_logprobs, token_entropy
from lit_asyncrl.warm_start import supervised_warm_start


class AsyncRLModule(L.LightningModule):
    """Policy-gradient training on version-tagged rollouts.

    `training_step` pulls its own batch (`dataloader_iter`): Lightning's default prefetch would take
    batch s+1 from the buffer before step s updates the weights, adding a version of staleness
    and deadlocking the on-policy (sync) baseline.

    Args:
        model_path: local Hugging Face model folder; None = the built-in tiny policy.
        loss: a registered loss strategy name (`lit_asyncrl.losses.available_losses()`).
        loss_kwargs: its keyword arguments (bounds as (low, high) ratios, aggregation, ...).
        reference: where pi_ref comes from: "none", "async_recompute", "snapshot", "ewma".
        reference_kwargs: its keyword arguments (e.g. the snapshot budget, the EWMA decay).
        lr, weight_decay: AdamW.
        entropy_coef: weight of an entropy bonus on policy tokens (guards against collapse).
        warm_start_steps, warm_start_lr: supervised steps on the environment's scripted
            demonstrations before RL (0 = none); skipped when resuming.
    """

    def __init__(
        self,
        model_path: str | None = None,
        loss: str = "ppo_clip_train_infer",
        loss_kwargs: dict[str, Any] | None = None,
        reference: str = "none",
        reference_kwargs: dict[str, Any] | None = None,
        lr: float = 3e-4,
        weight_decay: float = 0.0,
        entropy_coef: float = 0.0,
        warm_start_steps: int = 0,
        warm_start_lr: float = 1e-3,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        # Build the loss and the reference first: a bad name or bound fails before anything loads.
        self.loss_fn = get_loss(loss, **(loss_kwargs or {}))
        self.reference = build_reference(reference, **(reference_kwargs or {}))
        from transformers import AutoModelForCausalLM

        self.policy = AutoModelForCausalLM.from_pretrained(resolve_model_path(model_path), dtype=torch.float32)
        self.policy.train()  # from_pretrained returns eval mode
        self._warned_silent_reference = False
        self._last_step_start: float | None = None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.policy.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)

    def configure_callbacks(self) -> list[L.Callback]:
        from lit_asyncrl.rollout.weight_sync import EngineWeightSync

        return [EngineWeightSync(), *self.reference.callbacks()]

    def on_fit_start(self) -> None:
        datamodule = self.trainer.datamodule
        if self.hparams.warm_start_steps > 0 and self.trainer.global_step == 0:
            losses = supervised_warm_start(
                self.policy, datamodule.env, datamodule.tokenizer,
                steps=self.hparams.warm_start_steps, lr=self.hparams.warm_start_lr, seed=datamodule.seed,
            )
            self.print(f"warm start: {len(losses)} supervised steps, NLL {losses[0]:.3f} -> {losses[-1]:.3f}")

    def training_step(self, dataloader_iter: Iterator) -> torch.Tensor:
        # Wall time from the previous step's start: includes waiting for rollouts, the reference
        # stage, the update and the weight push (what a route's overhead adds to).
        now = time.perf_counter()
        step_s = None if self._last_step_start is None else now - self._last_step_start
        self._last_step_start = now
        batch, _, _ = next(dataloader_iter)
        batch = {key: value.to(self.device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}
        loss_mask = batch["loss_mask"]  # [B, T]
        version_gap = torch.where(loss_mask, self.global_step - batch["versions"], 0)  # [B, T]
        logits = self.policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logprobs = logits_to_token_logprobs(logits, batch["input_ids"], batch["temperature"], batch["top_k"])
        ref_logprobs = self.reference.ref_logprobs(self, batch, logprobs.detach())
        out = self.loss_fn(
            LossInputs(
                logprobs=logprobs,
                behavior_logprobs=batch["behavior_logprobs"],
                advantages=batch["advantages"],
                loss_mask=loss_mask,
                ref_logprobs=ref_logprobs,
                version_gap=version_gap,
            )
        )
        entropy = (token_entropy(logits, batch["temperature"]) * loss_mask).sum() / loss_mask.sum().clamp(min=1)
        loss = out.loss - self.hparams.entropy_coef * entropy
        self._warn_if_reference_is_silently_current(ref_logprobs, logprobs, version_gap, loss_mask)
        self._log_step(batch, out.metrics, version_gap, entropy, loss, ref_logprobs)
        if step_s is not None:
            self.log("train/step_s", step_s, batch_size=1)
        return loss

    def _log_step(self, batch: dict, loss_metrics: dict[str, float], version_gap: torch.Tensor, entropy: torch.Tensor, loss: torch.Tensor, ref_logprobs: torch.Tensor | None) -> None:
        size = batch["input_ids"].shape[0]
        gaps = version_gap[batch["loss_mask"]].float()
        metrics = {
            "train/task_success": batch["success"].mean().item(),
            "train/reward": batch["rewards"].mean().item(),
            "train/loss": loss.item(),
            "train/entropy": entropy.item(),
            "train/version_gap_mean": gaps.mean().item() if gaps.numel() else 0.0,
            "train/version_gap_max": gaps.max().item() if gaps.numel() else 0.0,
            "train/policy_tokens": float(gaps.numel()),
        }
        metrics.update(_reference_gap_metrics(ref_logprobs, batch["behavior_logprobs"], batch["loss_mask"]))
        # The strategy's own statistics (mask and clip ratios, KL, ESS, per-gap buckets) win on a clash.
        metrics.update({f"train/{key}": float(value) for key, value in loss_metrics.items()})
        # Rollout-side statistics ride in the batch under their own prefixes (rollout/, dedicated/).
        metrics.update({key: float(value) for key, value in batch.items() if "/" in key and isinstance(value, float)})
        self.log_dict(metrics, batch_size=size)
        progress = {"success": metrics["train/task_success"], "gap": metrics["train/version_gap_max"], "queue": metrics["rollout/queue_depth"]}
        self.log_dict(progress, prog_bar=True, logger=False, batch_size=size)

    def _warn_if_reference_is_silently_current(self, ref_logprobs, logprobs, version_gap, loss_mask) -> None:
        """Peers' users ask for this: old log-probs that are really the current weights (r_s == 1)."""
        if self._warned_silent_reference or ref_logprobs is None or self.reference.exact:
            return
        stale = loss_mask & (version_gap > 0)  # [B, T]
        if stale.any() and torch.equal(ref_logprobs[stale], logprobs.detach()[stale]):
            self._warned_silent_reference = True
            warnings.warn(
                f"model.reference={self.hparams.reference!r} gives the current weights' log-probs for stale tokens "
                "(r_s == 1 for every token with a version gap > 0): the PPO clip is a no-op and r_d absorbs the "
                "staleness. Use reference=snapshot, dedicated or interrupt_sync for exact pi_old, or ewma for a "
                "cheap proxy.",
                stacklevel=2,
            )


def _reference_gap_metrics(ref_logprobs: torch.Tensor | None, behavior_logprobs: torch.Tensor, loss_mask: torch.Tensor) -> dict[str, float]:
    """|log pi_ref - log mu| on scored policy tokens: the train-inference gap the reference sees.

    With an exact reference and an fp32 engine it stays at numerical noise at every version gap;
    unscored (non-finite) tokens are left out here and counted by the loss instead.
    """
    if ref_logprobs is None:
        return {}
    log_rd = (ref_logprobs - behavior_logprobs)[loss_mask].abs()
    log_rd = log_rd[torch.isfinite(log_rd)]
    if not log_rd.numel():
        return {}
    return {"train/ref_behavior_logratio_absmax": log_rd.max().item(), "train/ref_behavior_logratio_absmean": log_rd.mean().item()}
