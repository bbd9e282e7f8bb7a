"""The LightningModule: the policy, a loss strategy and a reference source."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterator, Mapping

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torchmetrics import MeanMetric

from lit_asyncrl.eval_metrics import HeldOutMetrics
from lit_asyncrl.fidelity import ReferenceFidelity
from lit_asyncrl.frozen_checkpoint import leave_out_frozen, restore_frozen
from lit_asyncrl.fsdp import FSDP2Strategy, shard_policy
from lit_asyncrl.kill_points import kill_if_asked
from lit_asyncrl.kl_penalty import ESTIMATORS as KL_ESTIMATORS
from lit_asyncrl.kl_penalty import KLPenalty
from lit_asyncrl.losses import LossInputs, LossStrategy, PPOClipTrainInfer
from lit_asyncrl.losses.aggregation import global_batch_scale
from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.models.lora import LoRASettings, add_adapter
from lit_asyncrl.models.moe_routing import BATCH_ROUTING, BatchRouting, applied, follow_batch_routing
from lit_asyncrl.models.policy import load_policy
from lit_asyncrl.reference import NoReference, ReferenceSource
from lit_asyncrl.scoring import live_logprobs_without_dropout, logits_to_token_logprobs, policy_logits, token_entropy
from lit_asyncrl.step_metrics import reference_gap_metrics, reward_terms

#: Step metrics that a step may lack (besides the per-gap buckets).
MAYBE_ABSENT = ("fidelity/version_drift_",)


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """What one training step computed, for its logs (`AsyncRLModule._log_step`).

    Attributes:
        loss: the step's loss (the policy loss less the entropy bonus).
        entropy: the policy's mean entropy over the batch's policy tokens.
        version_gap: [B, T] the trainer's version less each policy token's version (0 elsewhere).
        ref_logprobs: [B, T] the reference source's log pi_ref; None without one.
        loss_metrics: the loss strategy's own statistics (logged as `train/<key>`).
        fidelity: the fidelity shadow's metrics (`fidelity/*`); empty without it.
        routing_flipped: for a batch with the engine's routing (an MoE policy), the share of (position,
            layer) pairs whose experts the policy's routers chose otherwise; None without one.
        step_s: wall time since the previous step started; None for the first step after the start
            or after a held-out evaluation.
    """

    loss: torch.Tensor
    entropy: torch.Tensor
    version_gap: torch.Tensor
    ref_logprobs: torch.Tensor | None
    loss_metrics: dict[str, float]
    fidelity: dict[str, float]
    step_s: float | None
    routing_flipped: float | None


class AsyncRLModule(L.LightningModule):
    """Policy-gradient training on version-tagged rollouts.

    Trains on any DataModule that yields the batch schema of `lit_asyncrl.rollout.service`; the
    callbacks that tie it to a rollout service (weight push, rollout statistics, the reference's
    own) come from `configure_callbacks`.

    `training_step` pulls its own batch (`dataloader_iter`): Lightning's default prefetch would take
    batch s+1 from the buffer before step s updates the weights, adding a version of staleness
    and deadlocking the on-policy (sync) baseline.

    Args:
        model_path: a local Hugging Face folder, a hub id (fetched when online), "smollm2_135m" (a
            real chat model, offline) or None (the built-in tiny policy); see docs/models.md.
        loss: a loss strategy (`lit_asyncrl.losses`); None = `PPOClipTrainInfer()`.
        reference: where pi_ref comes from (`lit_asyncrl.reference`); None = `NoReference()`.
        lr, weight_decay: AdamW.
        entropy_coef: weight of an entropy bonus on policy tokens (guards against collapse).
        kl_coef, kl_estimator: a KL penalty to the model as loaded (`lit_asyncrl.kl_penalty`): weight
            (0 = none) and estimator ("k1" or "k3").
        train_last_layers: train only the last this many decoder layers and the final norm (the
            rest, embeddings and a tied head included, stay frozen); None = train everything.
            Makes a real model's step affordable on a CPU: frozen layers run forward only.
        fidelity: also compute exact old log-probs from snapshots of its own and log how far the
            reference in use is from them, per version gap (`fidelity/*`; see `lit_asyncrl.fidelity`).
        fidelity_proxies: other proxies the shadow measures on the same tokens, e.g.
            `["async_recompute", "linear_prox", "ewma", "ewma_0.9"]` (`lit_asyncrl.fidelity_panel`).
        lora: train a LoRA adapter (peft) instead of the model's weights (`LoRASettings`; rank 0,
            the default, trains the weights): the optimizer sees the adapter's parameters only.
        routing_replay: for a mixture-of-experts policy whose batches carry the engine's routing
            (`rollout.capture_routing`), score every token under the experts the engine chose (pi_theta
            and the references that score in the step: snapshots, the EWMA); False keeps the routers'
            own choice. Either way `train/routing_flipped` says how often it differs from the engine's.
    """

    def __init__(
        self,
        model_path: str | None = None,
        loss: LossStrategy | None = None,
        reference: ReferenceSource | None = None,
        lr: float = 3e-4,
        weight_decay: float = 0.0,
        entropy_coef: float = 0.0,
        kl_coef: float = 0.0,
        kl_estimator: str = "k3",
        train_last_layers: int | None = None,
        fidelity: bool = False,
        fidelity_proxies: list[str] | None = None,
        lora: LoRASettings | Mapping | None = None,
        routing_replay: bool = False,
    ) -> None:
        super().__init__()
        if not lr > 0:
            raise ValueError(f"model.lr must be > 0, got {lr}")
        if weight_decay < 0 or entropy_coef < 0:
            raise ValueError(
                f"model.weight_decay and model.entropy_coef must be >= 0, got {weight_decay} and {entropy_coef}"
            )
        # The adapter's settings as plain values: Lightning cannot write a frozen dataclass to
        # hparams.yaml (a checkpoint's `load_from_checkpoint` hands them back as a mapping).
        self.lora = LoRASettings(**lora) if isinstance(lora, Mapping) else lora if lora is not None else LoRASettings()
        self.save_hyperparameters(ignore=["loss", "reference", "lora"])
        self.hparams["lora"] = dataclasses.asdict(self.lora)
        self.loss_fn = loss if loss is not None else PPOClipTrainInfer()
        self.reference = reference if reference is not None else NoReference()
        if isinstance(fidelity_proxies, str):
            raise ValueError(
                f"fidelity_proxies must be a list of proxy names, e.g. [ewma,ewma_0.9], got {fidelity_proxies!r}"
            )
        if fidelity_proxies and not fidelity:
            raise ValueError("fidelity_proxies are measured by the fidelity shadow: set fidelity=true")
        self.fidelity = ReferenceFidelity(proxies=list(fidelity_proxies or ())) if fidelity else None
        _check_loss_and_reference(self.loss_fn, self.reference)
        if self.lora.enabled and train_last_layers is not None:
            raise ValueError(
                "model.lora.rank > 0 trains an adapter, model.train_last_layers the model's last layers: "
                "set one of them"
            )
        self.policy = load_policy(resolve_model_path(model_path))  # dropout off: a note says so
        self.kl_penalty = (
            KLPenalty(kl_coef, kl_estimator, resolve_model_path(model_path))
            if kl_coef != 0 or kl_estimator not in KL_ESTIMATORS
            else None
        )
        if train_last_layers is not None:
            freeze_all_but_last_layers(self.policy, train_last_layers)
        if self.lora.enabled:
            self.policy = add_adapter(self.policy, self.lora)
        follow_batch_routing(self.policy)  # an MoE's routers: batches that carry the engine's routing
        self.task_success = MeanMetric()
        # Held-out metrics, made at the first validation batch (k and a mixture's tasks come with it).
        self.eval_metrics: HeldOutMetrics | None = None
        self._warned_silent_reference = False
        self._last_step_start: float | None = None
        self._eval_metric_attributes: dict[int, str] = {}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        kill_if_asked("checkpoint_write", self.global_step)
        # Frozen parameters (the base under an adapter, frozen layers) come back from the model folder.
        leave_out_frozen(checkpoint, self, str(self.hparams.model_path))

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        restore_frozen(checkpoint, self, str(self.hparams.model_path))

    def configure_model(self) -> None:
        # Under trainer.strategy=fsdp2 (Lightning's ModelParallelStrategy) the module shards itself.
        if isinstance(self._trainer.strategy if self._trainer else None, FSDP2Strategy):
            shard_policy(self.policy, self.device_mesh["data_parallel"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        trainable = [parameter for parameter in self.policy.parameters() if parameter.requires_grad]
        return torch.optim.AdamW(trainable, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)

    def setup(self, stage: str) -> None:
        # After the datamodule's set-up (which configures its service) and the callbacks', before
        # training starts: the reference sources get the rollout service, once per fit.
        from lit_asyncrl.trainer_callbacks.find import rollouts_of

        rollouts = rollouts_of(self.trainer, "the module", required=False)
        self.reference.bind(rollouts)
        if self.fidelity is not None:
            self.fidelity.bind(rollouts)

    def configure_callbacks(self) -> list[L.Callback]:
        from lit_asyncrl.lifecycle import SigtermStaysOurs
        from lit_asyncrl.progress_bar import stream_progress_bar
        from lit_asyncrl.trainer_callbacks import EngineWeightSync, RolloutStatsLogger

        # Order matters: weights are published before the reference's callbacks act on a step's end.
        # Not required: with a DataModule of ready-made batches (no rollout service) they do nothing.
        return [
            # Replaces the trainer's default bar (a subclass of it), which would read "Epoch 0/-2".
            *stream_progress_bar("RL", self.trainer),
            SigtermStaysOurs(),
            EngineWeightSync(required=False, lora=self.lora),
            RolloutStatsLogger(required=False),
            *self.reference.callbacks(),
            *self._fidelity_callbacks(),
        ]

    def _fidelity_callbacks(self) -> list[L.Callback]:
        return self.fidelity.callbacks() if self.fidelity is not None else []

    def training_step(self, dataloader_iter: Iterator) -> torch.Tensor:
        # Wall time from the previous step's start: includes waiting for rollouts, the reference
        # stage, the update and the weight push (what a route's overhead adds to).
        now = time.perf_counter()
        step_s = None if self._last_step_start is None else now - self._last_step_start
        self._last_step_start = now
        batch, _, _ = next(dataloader_iter)
        kill_if_asked("train_step", self.global_step)
        batch = {
            key: value.to(self.device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()
        }
        loss_mask = batch["loss_mask"]  # [B, T]
        version_gap = torch.where(loss_mask, self.global_step - batch["versions"], 0)  # [B, T]
        routing = None
        if "routed_experts" in batch:  # an MoE's batch with the engine's routing
            routing = BatchRouting(
                batch["routed_experts"], batch["routed_experts_versions"], replay=self.hparams.routing_replay
            )
            batch[BATCH_ROUTING] = routing  # the references' forwards follow it too (`batch_routing_of`)
        with applied(routing):
            logits, start = policy_logits(self.policy, batch["input_ids"], batch["attention_mask"], loss_mask)
            # Positions before `start` are never policy tokens: their log-probs and entropies are 0, as a
            # sequence's first position's always were.
            kept = logits_to_token_logprobs(logits, batch["input_ids"][:, start:], batch["temperature"], batch["top_k"])
            logprobs = F.pad(kept, (start, 0))
            live_logprobs = live_logprobs_without_dropout(self.policy, batch, logprobs)
        ref_logprobs = self.reference.ref_logprobs(batch, live_logprobs, self.global_step)
        inputs = LossInputs(
            logprobs=logprobs,
            behavior_logprobs=batch["behavior_logprobs"],
            advantages=batch["advantages"],
            loss_mask=loss_mask,
            ref_logprobs=ref_logprobs,
            version_gap=version_gap,
        )
        out = self.loss_fn(inputs)
        valid = out.valid if out.valid is not None else loss_mask
        policy_loss = out.loss * self._global_batch_scale(valid, self.loss_fn.aggregation)
        fidelity = (
            {}
            if self.fidelity is None
            else self.fidelity.metrics(
                self.loss_fn, inputs, out.discrepancy_mask, batch, self.global_step, live_logprobs
            )
        )
        token_entropies = F.pad(token_entropy(logits, batch["temperature"]), (start, 0))
        entropy = (token_entropies * loss_mask).sum() / loss_mask.sum().clamp(min=1)
        entropy_bonus = self.hparams.entropy_coef * entropy
        if self.hparams.entropy_coef:
            entropy_bonus = entropy_bonus * self._global_batch_scale(loss_mask, "token_mean")
        loss = policy_loss - entropy_bonus
        loss_metrics = dict(out.metrics)
        if self.kl_penalty is not None:
            kl_loss, loss_metrics["kl_to_initial"] = self.kl_penalty.loss(self.policy, batch, logprobs)
            loss = loss + kl_loss * self._global_batch_scale(loss_mask, "token_mean")
        self._warn_if_reference_is_silently_current(ref_logprobs, live_logprobs, version_gap, loss_mask)
        outcome = StepOutcome(
            loss=loss,
            entropy=entropy,
            version_gap=version_gap,
            ref_logprobs=ref_logprobs,
            loss_metrics=loss_metrics,
            fidelity=fidelity,
            step_s=step_s,
            routing_flipped=None if routing is None else routing.flipped_share,
        )
        self._log_step(batch, outcome)
        return loss

    def _global_batch_scale(self, valid: torch.Tensor, aggregation: str) -> torch.Tensor | float:
        """Under DDP, makes this rank's term, aggregated with `aggregation` over `valid`, its share
        of the term over the global batch (see `global_batch_scale`); 1 in a single process."""
        trainer = self._trainer
        if trainer is None or trainer.world_size == 1:
            return 1.0
        reduce = functools.partial(trainer.strategy.reduce, reduce_op="sum")
        return global_batch_scale(valid, aggregation, trainer.world_size, reduce).to(valid.device)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        """Held-out episodes played by the data side (`success` [N, n], `greedy_success` [N], `k`;
        for a mixture of tasks also `task_ids` [N] and `task_names`)."""
        if self.eval_metrics is None:
            self.eval_metrics = HeldOutMetrics(int(batch["k"]), batch.get("task_names", ())).to(self.device)
            # Lightning maps logged metrics to attributes once, at the first (a training step's, before these exist).
            self._eval_metric_attributes = self.eval_metrics.attributes("eval_metrics")
        updated = self.eval_metrics.update(batch["success"], batch["greedy_success"], batch.get("task_ids"))
        for name, (metric, instances) in updated.items():
            attribute = self._eval_metric_attributes[id(metric)]
            shown = name == f"val/avg@{self.eval_metrics.k}"
            self.log(name, metric, batch_size=instances, prog_bar=shown, metric_attribute=attribute)

    def on_validation_epoch_end(self) -> None:
        # Lightning logs nothing while sanity checking; with num_sanity_val_steps=-1 that check is
        # the whole held-out evaluation before the first RL step (after the warm start): keep it.
        if self.trainer.sanity_checking and self.eval_metrics is not None:
            values = self.eval_metrics.compute()
            for logger in self.loggers:
                logger.log_metrics(values, step=self.global_step)

    def on_validation_end(self) -> None:
        self._last_step_start = None  # the next step's wall time must not include the evaluation

    def _log_step(self, batch: dict, outcome: StepOutcome) -> None:
        size = batch["input_ids"].shape[0]
        step_s = outcome.step_s
        gaps = outcome.version_gap[batch["loss_mask"]].float()
        # A torchmetrics mean: averaged over ranks under DDP, weighted by episodes.
        self.task_success(batch["success"])
        self.log("train/task_success", self.task_success, on_step=True, on_epoch=False, batch_size=size)
        metrics = {
            "train/reward": batch["rewards"].mean().item(),
            "train/loss": outcome.loss.item(),
            "train/entropy": outcome.entropy.item(),
            "train/version_gap_mean": gaps.mean().item() if gaps.numel() else 0.0,
            "train/version_gap_max": gaps.max().item() if gaps.numel() else 0.0,
            "train/policy_tokens": float(gaps.numel()),
        }
        if "episode_s" in batch:  # optional in the schema: ready-made batches may lack it
            metrics["train/episode_s"] = batch["episode_s"].mean().item()
        if step_s is not None:
            metrics["train/step_s"] = step_s
        if outcome.routing_flipped is not None:
            metrics["train/routing_flipped"] = outcome.routing_flipped
        metrics.update(
            reference_gap_metrics(
                outcome.ref_logprobs, batch["behavior_logprobs"], batch["loss_mask"], outcome.version_gap
            )
        )
        # The strategy's own statistics (mask and clip ratios, KL, ESS, per-gap buckets) win on a clash.
        metrics.update({f"train/{key}": float(value) for key, value in outcome.loss_metrics.items()})
        metrics.update(outcome.fidelity)
        # A version-gap bucket with no tokens in a step (or a mixture's task with no episode, or a
        # drift whose previous version is gone) must be absent from that step's row, but `self.log`
        # repeats a key's last value at every later step: these go to the loggers directly.
        buckets = (
            {key: value for key, value in metrics.items() if "/gap_" in key or key.startswith(MAYBE_ABSENT)}
            | self._task_success(batch)
            | reward_terms(batch)
        )
        self.log_dict({key: value for key, value in metrics.items() if key not in buckets}, batch_size=size)
        for logger in self.loggers if buckets else ():
            logger.log_metrics(buckets, step=self.global_step)
        progress = {"success": batch["success"].mean().item(), "gap": metrics["train/version_gap_max"]}
        if step_s is not None:
            progress["step_s"] = step_s
        self.log_dict(progress, prog_bar=True, logger=False, batch_size=size)

    def _task_success(self, batch: dict) -> dict[str, float]:
        """A mixture's training success per task over the global batch (`train/<task>/task_success`;
        a task with no episode in the batch is left out). Empty for a single task."""
        names = batch.get("task_names")
        if not names:
            return {}
        task_ids = batch["task_ids"]
        totals = torch.zeros(2, len(names), dtype=torch.float64, device=task_ids.device)  # successes, episodes
        totals[0].index_add_(0, task_ids, batch["success"].double())
        totals[1].index_add_(0, task_ids, torch.ones_like(task_ids, dtype=torch.float64))
        if self._trainer is not None and self.trainer.world_size > 1:
            totals = self.trainer.strategy.reduce(totals, reduce_op="sum")  # every rank holds part of the batch
        return {
            f"train/{name}/task_success": won / played
            for name, won, played in zip(names, *totals.tolist())
            if played > 0
        }

    def _warn_if_reference_is_silently_current(
        self,
        ref_logprobs: torch.Tensor | None,
        logprobs: torch.Tensor,
        version_gap: torch.Tensor,
        loss_mask: torch.Tensor,
    ) -> None:
        """Peers' users ask for this: old log-probs that are really the current weights (r_s == 1)."""
        if (
            self._warned_silent_reference
            or ref_logprobs is None
            or self.reference.exact
            or self.reference.may_equal_current
        ):
            return
        stale = loss_mask & (version_gap > 0)  # [B, T]
        if stale.any() and torch.equal(ref_logprobs[stale], logprobs.detach()[stale]):
            self._warned_silent_reference = True
            rank_zero_warn(  # once per run, not once per DDP process
                f"the reference {type(self.reference).__name__} gives the current weights' log-probs for stale tokens "
                "(r_s == 1 for every token with a version gap > 0): the PPO clip is a no-op and r_d absorbs the "
                "staleness. Use reference=snapshot, dedicated or interrupt_sync for exact pi_old, or ewma for a "
                "cheap proxy.",
                stacklevel=3,
            )


def freeze_all_but_last_layers(policy: torch.nn.Module, count: int) -> None:
    """Leave only the last `count` decoder layers and the final norm trainable."""
    decoder = policy.get_decoder()
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(
            f"model.train_last_layers: {type(policy).__name__} has no decoder `layers` list to choose from"
        )
    if not 1 <= count <= len(layers):
        raise ValueError(f"model.train_last_layers must be in 1..{len(layers)} for this model, got {count}")
    policy.requires_grad_(False)
    for layer in layers[len(layers) - count :]:
        layer.requires_grad_(True)
    norm = getattr(decoder, "norm", None)
    if isinstance(norm, torch.nn.Module):
        norm.requires_grad_(True)


def _check_loss_and_reference(loss: LossStrategy, reference: ReferenceSource) -> None:
    """Refuse a loss that needs pi_ref without a reference source, before anything loads."""
    if not isinstance(loss, LossStrategy):
        raise TypeError(f"model.loss must be a lit_asyncrl.losses.LossStrategy, got {type(loss).__name__}")
    if not isinstance(reference, ReferenceSource):
        raise TypeError(
            f"model.reference must be a lit_asyncrl.reference.ReferenceSource, got {type(reference).__name__}"
        )
    if loss.reference_use == "required" and isinstance(reference, NoReference):
        raise ValueError(
            f"model.loss={loss.name or type(loss).__name__} needs a reference source (pi_ref) but model.reference is "
            "none; choose reference=snapshot, dedicated, interrupt_sync (exact), ewma or async_recompute (proxies)"
        )
