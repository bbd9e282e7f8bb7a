"""The tensors a loss strategy reads and the result it returns.

Notation follows docs/method.md (the paper's Sec. 3.2): ``pi_theta`` is the policy being
optimised, ``mu_old`` the inference-side distribution that sampled the token, ``pi_ref`` the training-side
reference (exact old logits, async recompute or EWMA) and ``n`` the token's version gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class LossInputs:
    """Per-token inputs of every loss strategy; all tensors are ``[B, T]``.

    Args:
        logprobs: ``log pi_theta(y_t)``; the only tensor that carries gradient.
        behavior_logprobs: ``log mu_old(y_t)``, the log-prob the rollout engine sampled with.
        advantages: ``A_t`` (a sequence advantage broadcast over its tokens is fine).
        loss_mask: bool, True on policy tokens (tokens the environment wrote are False).
        ref_logprobs: ``log pi_ref(y_t)`` (exact old logits, async recompute or EWMA), or None.
        version_gap: long, ``n`` = trainer version minus the version that sampled the token, or None.
    """

    logprobs: Tensor
    behavior_logprobs: Tensor
    advantages: Tensor
    loss_mask: Tensor
    ref_logprobs: Tensor | None = None
    version_gap: Tensor | None = None


@dataclass
class LossOutput:
    """What a strategy returns.

    Attributes:
        loss: scalar to minimise; gradient flows through ``LossInputs.logprobs`` only.
        discrepancy_mask: bool ``[B, T]``, token kept by the train-infer mask on ``r_d`` (symmetric,
            except MIS's one-sided default; True on every valid policy token when the strategy has no
            such mask).
        clip_mask: bool ``[B, T]``, token inside the trust region for its advantage sign, i.e. the
            staleness term still passes gradient (see each strategy for its exact meaning).
        metrics: detached floats, keys without prefix (the module logs them under ``train/``).
        valid: bool ``[B, T]``, the tokens in the aggregation's denominators (policy tokens with
            finite inputs); None where a strategy does not say (every policy token counts).
    """

    loss: Tensor
    discrepancy_mask: Tensor
    clip_mask: Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    valid: Tensor | None = None


@dataclass
class PreparedInputs:
    """Inputs after validation: finite, detached where they must be, ``valid`` marks usable tokens.

    Non-finite values are replaced by 0 so that no NaN reaches the backward pass; the tokens that
    carried them are excluded from ``valid`` and counted in ``nonfinite_tokens``.
    """

    logprobs: Tensor  # [B, T], grad
    behavior_logprobs: Tensor  # [B, T], detached
    advantages: Tensor  # [B, T], detached
    valid: Tensor  # [B, T] bool: policy token with finite inputs
    ref_logprobs: Tensor | None  # [B, T], detached
    version_gap: Tensor | None  # [B, T] long, >= 0
    nonfinite_tokens: Tensor  # scalar long

    @property
    def anchor_logprobs(self) -> Tensor:
        """``log pi_ref`` when a reference is given, else ``log mu_old`` (plain PPO on pi/mu)."""
        return self.ref_logprobs if self.ref_logprobs is not None else self.behavior_logprobs


def _check_shape(name: str, tensor: Tensor, shape: torch.Size) -> None:
    if not isinstance(tensor, Tensor):
        raise ValueError(f"LossInputs.{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.shape != shape:
        raise ValueError(f"LossInputs.{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)}")


def _compute_dtype(logprobs: Tensor) -> torch.dtype:
    # exp() of half-precision log-ratios loses the 1e-3 differences the bounds are about.
    return logprobs.dtype if logprobs.dtype in (torch.float32, torch.float64) else torch.float32


def prepare_inputs(inputs: LossInputs, *, use_reference: bool) -> PreparedInputs:
    """Validate shapes, mask and count non-finite values, detach everything but ``logprobs``."""
    shape = inputs.logprobs.shape
    if len(shape) != 2:
        raise ValueError(f"LossInputs.logprobs must be [B, T], got shape {tuple(shape)}")
    for name in ("behavior_logprobs", "advantages", "loss_mask"):
        _check_shape(name, getattr(inputs, name), shape)
    if inputs.ref_logprobs is not None:
        _check_shape("ref_logprobs", inputs.ref_logprobs, shape)
    if inputs.version_gap is not None:
        _check_shape("version_gap", inputs.version_gap, shape)

    dtype = _compute_dtype(inputs.logprobs)
    logprobs = inputs.logprobs.to(dtype)
    behavior = inputs.behavior_logprobs.detach().to(dtype)
    advantages = inputs.advantages.detach().to(dtype)
    ref = inputs.ref_logprobs.detach().to(dtype) if use_reference and inputs.ref_logprobs is not None else None
    policy = inputs.loss_mask if inputs.loss_mask.dtype == torch.bool else inputs.loss_mask.bool()  # [B, T]
    version_gap = inputs.version_gap.long() if inputs.version_gap is not None else None
    floats = [logprobs.detach(), behavior, advantages] + ([ref] if ref is not None else [])

    all_finite, gap_nonnegative = _quick_checks(floats, version_gap)
    if version_gap is not None and not gap_nonnegative:
        version_gap = version_gap.clamp(min=0)
    if all_finite:  # the common case: nothing to sanitise
        no_token = torch.zeros((), dtype=torch.long, device=policy.device)
        return PreparedInputs(logprobs, behavior, advantages, policy, ref, version_gap, nonfinite_tokens=no_token)

    # The exact per-token check, when the reductions could not rule out a problem. One fused check: a
    # sum is finite iff every term is (a float32 sum of finite log-probs and advantages overflows only
    # past 3e38), which halves the cost of four isfinite() calls.
    checked = floats[0] + floats[1]  # [B, T]
    for tensor in floats[2:]:
        checked = checked + tensor
    finite = torch.isfinite(checked)  # [B, T]
    if bool(finite.all()):  # large but finite values: nothing to sanitise either
        no_token = torch.zeros((), dtype=torch.long, device=policy.device)
        return PreparedInputs(logprobs, behavior, advantages, policy, ref, version_gap, nonfinite_tokens=no_token)

    def sanitise(tensor: Tensor) -> Tensor:
        # torch.where (not multiplication) so that NaN/inf never enter a product, forward or backward.
        return torch.where(finite, tensor, torch.zeros((), dtype=dtype, device=tensor.device))

    return PreparedInputs(
        logprobs=sanitise(logprobs),
        behavior_logprobs=sanitise(behavior),
        advantages=sanitise(advantages),
        valid=policy & finite,
        ref_logprobs=sanitise(ref) if ref is not None else None,
        version_gap=version_gap,
        nonfinite_tokens=(policy & ~finite).sum(),
    )


def _quick_checks(floats: list[Tensor], version_gap: Tensor | None) -> tuple[bool, bool]:
    """``(every float input is finite and small enough, every version gap is >= 0)``, one host transfer.

    Reductions only (``aminmax``, no [B, T] temporary): when every value lies within ``+-max/4`` of the
    dtype, no token's sum of its (at most four) inputs can overflow, so the fused per-token check
    below would pass every token. NaN propagates through min/max and fails the test, as does +-inf;
    then, or for huge finite values, the exact per-token check runs.
    """
    if floats[0].numel() == 0:
        return True, True
    extremes = [value for tensor in floats for value in torch.aminmax(tensor)]
    if version_gap is not None:
        extremes.append(version_gap.min().to(floats[0].dtype))
    stats = torch.stack(extremes).tolist()
    gap_nonnegative = version_gap is None or stats.pop() >= 0
    limit = torch.finfo(floats[0].dtype).max / 4
    return all(-limit <= value <= limit for value in stats), gap_nonnegative
