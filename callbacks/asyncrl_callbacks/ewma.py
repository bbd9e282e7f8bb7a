r"""PPO-EWMA reference policy: a debiased exponential moving average of a module's parameters.

After optimizer step ``t`` the average is (paper, section 5.2; Hilton et al., 2022)

    theta_prox_t = sum_{k=0..t} beta^(t-k) theta_k / Z_t,        Z_t = sum_{k=0..t} beta^(t-k),

where ``theta_0`` are the weights when fitting starts. Like ``EwmaModel`` in openai/ppo-ewma, the callback keeps
the *normalised* average together with its running total weight ``Z`` rather than the raw sum
``S_t = beta S_{t-1} + theta_t``. Since ``Z_t = beta Z_{t-1} + 1``, i.e. ``beta Z_{t-1} = Z_t - 1``,

    theta_prox_t = (beta Z_{t-1} theta_prox_{t-1} + theta_t) / Z_t
                 = theta_prox_{t-1} + (theta_t - theta_prox_{t-1}) / Z_t,

one fused ``torch._foreach_lerp_`` with weight ``1 / Z_t``. The normalised tensors feed the reference forward
directly (no division per forward) and stay at the weights' scale. ``beta`` may change between steps (automatic
window): the result is still the weighted mean with weights ``prod beta``. A reset is the same update with
``beta = 0``: ``Z = 1`` and ``theta_prox = theta`` exactly (``lerp`` with weight 1 returns its end point).

Decay from the staleness window (the paper's Appendix B): the EWMA gives age ``j`` (optimizer steps back) the weight
``(1 - beta) beta^j``, so its centre of mass sits at age ``beta / (1 - beta)``. With ``beta = W / (W + 2)`` that is
``W / 2``, the middle of the version window ``[v - W, v]`` from which the trained tokens were sampled. At a
version-gap cap of 3 (the paper's setting) the rule gives ``beta = 0.6``. With ``W = 0`` it gives ``beta = 0``:
every update re-centres the average on the live weights, so the reference *is* the current policy
(``pi_ref = pi_theta``, ``r_s = 1``). The automatic window gets ``W = 0`` whenever every gap observed so far is 0:
for the whole run when rollouts are synchronous, and in the first steps of an asynchronous run, until a stale
batch arrives. The callback warns once when an update runs with a window-derived ``beta = 0``.

The auto-reset (``tau``, ``patience``) follows the paper's re-centring when the train-inference mask stays low; the
paper reports ``tau = 0.9`` and ``0.8`` but no streak length: ``patience = 3`` is this library's choice.

Why not WeightAveraging
-----------------------
Lightning's ``WeightAveraging`` / ``EMAWeightAveraging`` (over ``torch.optim.swa_utils.AveragedModel``) average
weights for *evaluation*; a proximal reference is a *training-time* policy, which changes four things:

* **Debiasing.** ``get_ema_avg_fn`` copies ``theta_0`` and then does ``avg = beta avg + (1 - beta) theta``, so
  ``theta_0`` keeps weight ``beta^t`` instead of ``beta^t / Z_t``: the reference leans on the initial (or reset)
  weights for the first ``~1 / (1 - beta)`` steps. A ``multi_avg_fn`` could debias from ``num_averaged`` only for
  a fixed ``beta``; the automatic window changes ``beta`` and a reset would have to rewrite ``n_averaged``.
* **Reference forward during training.** ``WeightAveraging`` swaps the average into the live module for
  validation (two full copies). The reference log-probs are needed in every ``training_step`` next to the live
  forward that carries the gradient; ``torch.func.functional_call`` runs the live module with the averaged
  tensors, so the live weights are never swapped or copied.
* **What is stored and checkpointed.** ``AveragedModel`` deep-copies the whole ``LightningModule`` (frozen weights,
  buffers, value heads, a reward model); this keeps only the trainable parameters of one submodule.
  ``WeightAveraging`` also writes the average into ``checkpoint["state_dict"]``; here the live policy stays there
  and the average is auxiliary state under ``state_key``, so several instances coexist.
* **Reset.** ``AveragedModel`` has no re-centring; the paper's auto-reset needs one.

What is kept from it: updating in ``on_train_batch_end`` only when ``global_step`` advanced during the batch
(gradient accumulation updates once per optimizer step), behaviour extended by overriding a predicate
(``should_reset`` for its ``should_update``), counters in ``state_dict`` and tensors through the checkpoint hooks
with a warning for old checkpoints.

"""

import math
from typing import Any, Literal

import torch
from asyncrl_callbacks.eval_mode import evaluation_mode
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn
from torch.func import functional_call
from typing_extensions import override

_CHECKPOINT_KEY = "ewma_reference"


class EWMAReference(Callback):
    r"""Keeps a debiased EWMA of a module's trainable parameters as a proximal reference policy (PPO-EWMA).

    After every optimizer step the average folds in the new weights (see the module docstring for the update).
    :meth:`reference_forward` runs the target module with the averaged weights; :meth:`observe_version_gaps` feeds
    the automatic staleness window; the average re-centres on the live weights (:meth:`reset`) when the monitored
    metric stays below ``tau`` for ``patience`` consecutive optimizer steps (see :meth:`should_reset`).

    Logs ``reference/ewma_resets`` (resets so far), ``reference/low_mask_streak`` (consecutive low steps reached at
    this step; a step that triggers a reset shows ``patience``, the next count starts from 0) and
    ``reference/ewma_beta`` (the decay used), with ``log_prefix`` in place of ``reference/``.

    Under DDP every rank holds the same average: the parameters are identical after the all-reduced step, and the
    monitored value (mean over ranks) and the observed gaps (max over ranks) are gathered before any decision.
    Sharded strategies (FSDP, DeepSpeed) are not supported.

    Example::

        from asyncrl_callbacks import EWMAReference


        class Agent(LightningModule):
            def __init__(self):
                super().__init__()
                self.policy = build_policy()
                self.ewma = EWMAReference(staleness_window="auto", module_attr="policy", tau=0.8, patience=3)

            def configure_callbacks(self):
                return [self.ewma]

            def training_step(self, batch, batch_idx):
                self.ewma.observe_version_gaps(batch["version_gap"][batch["loss_mask"]])
                logits = self.policy(batch["input_ids"])
                ref_logits = self.ewma.reference_forward(batch["input_ids"])  # no grad, averaged weights
                ...
                self.log("train/train_infer_mask", kept_fraction)

    Args:
        beta: Fixed decay in ``[0, 1)``. Give this or ``staleness_window``, not both.
        staleness_window: ``W`` for ``beta = W / (W + 2)`` (0.6 at ``W = 3``): a number, or ``"auto"`` to use the
            running max of the gaps given to :meth:`observe_version_gaps` (``default_window`` until the first one).
            ``"auto"`` when neither this nor ``beta`` is given. ``W = 0`` (e.g. every observed gap 0, synchronous
            rollouts) gives ``beta = 0``: the average is then the live weights after every step (warned once).
        module_attr: Name (dotted path allowed) of the submodule to average, e.g. ``"policy"``; ``None`` averages
            the whole ``LightningModule``.
        monitor: Key in ``trainer.callback_metrics`` watched for the reset. Log it from ``training_step`` at every
            step (``on_step=True``): Lightning keeps the last logged value there, so a step that logs nothing
            counts the previous value again. A NaN value (e.g. a batch without policy tokens) neither extends nor
            breaks the streak; until the key is first logged, the reset is idle (with a warning).
        tau: A step is *low* when the monitored value is below ``tau`` (0.8 is one of the paper's two values).
        patience: Reset at the ``patience``-th consecutive low step; ``None`` never resets (the streak is still
            counted and logged). The default 3 is this library's choice; the paper gives no streak length.
        log_prefix: Prefix of the logged keys; give each instance its own when using several.

    """

    #: W used by ``staleness_window="auto"`` before any gap is observed: beta = 0.5, the paper's short-memory
    #: setting, which errs on the side of a reference close to the current policy.
    default_window: float = 2.0

    def __init__(
        self,
        beta: float | None = None,
        staleness_window: float | Literal["auto"] | None = None,
        module_attr: str | None = None,
        monitor: str = "train/train_infer_mask",
        tau: float = 0.8,
        patience: int | None = 3,
        log_prefix: str = "reference/",
    ) -> None:
        if beta is not None and staleness_window is not None:
            raise ValueError("Give either `beta` or `staleness_window`, not both.")
        if beta is not None and not 0.0 <= beta < 1.0:
            raise ValueError(f"`beta` must be in [0, 1), got {beta}.")
        if staleness_window not in (None, "auto") and not float(staleness_window) >= 0:
            raise ValueError(f"`staleness_window` must be >= 0 or 'auto', got {staleness_window!r}.")
        if patience is not None and patience < 1:
            raise ValueError(f"`patience` must be >= 1 or None, got {patience}.")
        self._beta = beta
        self._window = "auto" if beta is None and staleness_window is None else staleness_window
        self.module_attr = module_attr
        self.monitor = monitor
        self.tau = tau
        self.patience = patience
        self.log_prefix = log_prefix

        self.num_resets = 0
        self.low_streak = 0
        self._observed_window: float | None = None  # running max of the observed gaps, identical on all ranks
        self._pending_gap: Tensor | None = None  # this rank's max gap since the last update (kept on device: no sync)
        self._target: nn.Module | None = None
        self._names: list[str] = []
        self._average: list[Tensor] = []  # theta_prox, aligned with self._names
        self._total_weight = 0.0  # Z_t
        self._loaded: dict[str, Any] | None = None  # checkpointed average waiting for the weights to exist
        self._step_before_batch = 0
        self._warned: set[str] = set()

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(
            module_attr=self.module_attr, beta=self._beta, staleness_window=self._window, log_prefix=self.log_prefix
        )

    @property
    def staleness_window(self) -> float | None:
        """The window ``W`` in use (given, observed or ``default_window``); ``None`` when ``beta`` is fixed."""
        if self._beta is not None:
            return None
        if self._window != "auto":
            return float(self._window)
        return self.default_window if self._observed_window is None else self._observed_window

    @property
    def beta(self) -> float:
        """The decay used by the next update: the fixed ``beta`` or ``W / (W + 2)``."""
        if self._beta is not None:
            return self._beta
        window = self.staleness_window
        return window / (window + 2.0)

    @property
    def averaged_parameters(self) -> dict[str, Tensor]:
        """``theta_prox`` by parameter name (the live tensors of the average: read, do not modify)."""
        return dict(zip(self._names, self._average))

    @property
    def holds_only_live_weights(self) -> bool:
        """True from an attach or a reset until the next update: ``theta_prox`` is the live weights (``Z = 1``)."""
        return self._total_weight == 1.0

    def attach(self, module: nn.Module) -> None:
        """Starts the average at ``module``'s current trainable weights (``Z = 1``).

        The callback calls this in ``on_fit_start``; call it yourself to use the average without a Trainer.
        """
        self._target = module
        named = {name: p for name, p in module.named_parameters() if p.requires_grad}
        self._names = list(named)
        self._average = [p.detach().clone() for p in named.values()]
        self._total_weight = 1.0

    @torch.no_grad()
    def update(self, beta: float | None = None) -> None:
        """Folds the live weights into the average: ``Z <- beta Z + 1``, ``theta_prox <- lerp(theta_prox, theta, 1/Z)``.

        Args:
            beta: Decay for this update; :attr:`beta` by default. ``0`` re-centres on the live weights.

        """
        self._total_weight = (self.beta if beta is None else beta) * self._total_weight + 1.0
        torch._foreach_lerp_(self._average, self._live_params(), 1.0 / self._total_weight)

    def reset(self) -> None:
        """Re-centres the average on the live weights (``theta_prox <- theta``) and counts the reset."""
        self.update(beta=0.0)
        self.num_resets += 1
        self.low_streak = 0

    @torch.no_grad()
    def reference_forward(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the target module's ``forward`` with the averaged weights, without gradients.

        Buffers and frozen parameters are the live module's own; the forward runs in eval mode (no dropout:
        the reference is a policy, not a sample of one), and the module's mode is back as it was afterwards.
        """
        if self._target is None:
            raise RuntimeError("EWMAReference has no average yet: it starts in `on_fit_start` (or call `attach`).")
        with evaluation_mode(self._target):
            return functional_call(self._target, self.averaged_parameters, args, kwargs)

    def observe_version_gaps(self, gaps: Tensor) -> None:
        """Records the version gaps of the tokens being trained on, for ``staleness_window="auto"``.

        A gap is the trainer's weight version minus the version that sampled the token, in optimizer steps (the
        average's unit of time); pass the gaps of policy tokens only. ``W`` becomes the running max of all gaps
        observed so far, gathered across ranks at the next update. Does not synchronise the device.

        Why the max: ``W`` is the *width* of the version window (the staleness cap of a bounded async buffer), and
        ``W / (W + 2)`` puts the centre of mass at ``W / 2``. The max of observed gaps converges to that width in a
        few steps; the mean gap estimates the window's *centre* (``W / 2`` for evenly spread versions), so using it
        as ``W`` would put the reference a quarter of the way back, too close to the current policy. The max is
        also monotone, so ``beta`` settles instead of jittering with each batch's mix of versions. Its weakness,
        one outlier raising ``W`` for good, is bounded when the buffer drops samples beyond its staleness cap.
        """
        if gaps.numel() == 0:
            return
        batch_max = gaps.detach().max().to(torch.float32)
        self._pending_gap = batch_max if self._pending_gap is None else torch.maximum(self._pending_gap, batch_max)

    def should_reset(self, trainer: Trainer, pl_module: LightningModule, value: float) -> bool:
        """Decides, after each optimizer step, whether to re-centre the average on the live weights.

        Called with the monitored value (mean over ranks) once :attr:`low_streak` has been updated for this step.
        Override it for another rule; it must return the same answer on every rank.

        Returns:
            ``True`` at the ``patience``-th consecutive step below ``tau``; never when ``patience`` is ``None``.

        """
        return self.patience is not None and self.low_streak >= self.patience

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Forgets a checkpointed average left by an earlier non-fit run (restoring happens after ``setup``)."""
        self._loaded = None

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Starts the average at the current weights, on their device, or at the checkpointed average.

        This runs after the strategy moved the model and after ``configure_model``, so all weights exist.
        """
        self.attach(pl_module if self.module_attr is None else pl_module.get_submodule(self.module_attr))
        self._restore_average()

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Remembers the step count, to tell in ``on_train_batch_end`` whether an optimizer step happened."""
        self._step_before_batch = trainer.global_step

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After an optimizer step: folds the new weights into the average, then counts the streak and resets.

        Batches without an optimizer step (gradient accumulation) change nothing. Lightning has no hook after
        ``optimizer.step``; this one follows it with nothing in between that reads the reference, sees the metrics
        logged by the step, and also works with manual optimization.
        """
        if trainer.global_step == self._step_before_batch:
            return
        value = self._gather_observations(trainer)
        self._warn_if_window_gives_zero_beta()
        self.update()
        streak = self._track(trainer, pl_module, value)
        self._log(pl_module, streak)

    @override
    def state_dict(self) -> dict[str, Any]:
        """Counters read by ``beta`` and ``should_reset``; the average itself goes through ``on_save_checkpoint``."""
        return {"num_resets": self.num_resets, "low_streak": self.low_streak, "observed_window": self._observed_window}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the counters saved by :meth:`state_dict`."""
        self.num_resets = state_dict["num_resets"]
        self.low_streak = state_dict["low_streak"]
        self._observed_window = state_dict["observed_window"]

    @override
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """Saves the average with its total weight under ``checkpoint["ewma_reference"][state_key]``.

        The total weight travels with the tensors because one is meaningless without the other.
        """
        if self._target is None:
            return  # saved outside fitting: there is no average
        state = {"average": self.averaged_parameters, "total_weight": self._total_weight}
        checkpoint.setdefault(_CHECKPOINT_KEY, {})[self.state_key] = state

    @override
    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        """Restores the average; a checkpoint without one starts it at the loaded weights, with a warning."""
        state = checkpoint.get(_CHECKPOINT_KEY, {}).get(self.state_key)
        if state is None:
            rank_zero_warn(
                f"The checkpoint has no EWMA average for {self.state_key}; the average starts at the loaded weights."
            )
        self._loaded = state or {}
        if self._target is not None:  # strategies that restore after `on_fit_start` (e.g. FSDP)
            self._restore_average()

    def _restore_average(self) -> None:
        """Applies a checkpointed average (or, for an empty one, the live weights) once the weights exist."""
        state = self._loaded
        self._loaded = None
        if state is None:
            return
        saved = state.get("average")
        if saved is None or list(saved) != self._names:
            if saved is not None:
                rank_zero_warn("The checkpointed EWMA average names other parameters; it starts at the live weights.")
            self.update(beta=0.0)
            return
        torch._foreach_copy_(self._average, [saved[name] for name in self._names])
        self._total_weight = state["total_weight"]

    def _live_params(self) -> list[Tensor]:
        """The target's live parameters, in the order of the average."""
        assert self._target is not None
        named = dict(self._target.named_parameters())
        return [named[name] for name in self._names]

    def _gather_observations(self, trainer: Trainer) -> float:
        """Returns the monitored value and folds the pending gaps into ``W``, both identical on every rank."""
        local = torch.tensor([self._monitored_value(trainer), self._take_pending_gap()], dtype=torch.float32)
        if trainer.world_size > 1:
            gathered = trainer.strategy.all_gather(local.to(trainer.strategy.root_device)).cpu()  # [world, 2]
            local = torch.stack([gathered[:, 0].mean(), gathered[:, 1].max()])  # a NaN value anywhere stays NaN
        value, gap = local.tolist()
        if gap >= 0:
            self._observed_window = max(gap, self._observed_window or 0.0)
        elif self._window == "auto" and self._observed_window is None:
            self._warn_once("gaps", f"No version gaps observed yet: EWMA uses W={self.default_window}.")
        return value

    def _warn_if_window_gives_zero_beta(self) -> None:
        """Warns once when the staleness window makes this update's ``beta`` 0 (an explicit ``beta=0`` is not
        warned)."""
        if self._beta is not None or self.beta != 0.0:
            return
        why = "every version gap observed so far is 0" if self._window == "auto" else "staleness_window=0"
        self._warn_once(
            "zero_beta",
            f"EWMA beta=0: the staleness window is W=0 ({why}), so each update re-centres the average on the live "
            "weights and the reference is the current policy (pi_ref = pi_theta, r_s = 1). With an automatic window "
            "this is expected until the first stale batch of an asynchronous run; with synchronous rollouts it lasts "
            "the whole run. Give `beta` or a `staleness_window` > 0 for a smoothed reference.",
        )

    def _monitored_value(self, trainer: Trainer) -> float:
        """This rank's monitored value (the last one logged), or NaN when it was never logged."""
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            if self.patience is not None:
                self._warn_once("monitor", f"`{self.monitor}` is not in callback_metrics: EWMA auto-reset is idle.")
            return math.nan
        return float(value)

    def _take_pending_gap(self) -> float:
        """This rank's max gap since the last update, or -1 when none was observed."""
        gap = self._pending_gap
        self._pending_gap = None
        return -1.0 if gap is None else float(gap)

    def _track(self, trainer: Trainer, pl_module: LightningModule, value: float) -> int:
        """Counts the low-value streak, resets when ``should_reset`` says so, and returns the streak reached."""
        if math.isnan(value):
            return self.low_streak  # no value (not logged yet, or NaN on some rank): neither extends nor breaks it
        self.low_streak = self.low_streak + 1 if value < self.tau else 0
        streak = self.low_streak
        if self.should_reset(trainer, pl_module, value):
            self.reset()
        return streak

    def _log(self, pl_module: LightningModule, streak: int) -> None:
        """Logs the reset counter, the streak and the decay for this step.

        `batch_size=1`: these are per-step scalars, and modules whose `training_step` pulls its
        own batch (`dataloader_iter`) require an explicit batch size.
        """
        values = {
            "ewma_resets": float(self.num_resets),
            "low_mask_streak": float(streak),
            "ewma_beta": float(self.beta),
        }
        pl_module.log_dict({f"{self.log_prefix}{key}": value for key, value in values.items()}, batch_size=1)

    def _warn_once(self, key: str, message: str) -> None:
        """Warns (on rank zero) the first time ``key`` comes up."""
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(message)
