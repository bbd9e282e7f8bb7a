"""Builders shared by the loss tests: float64 tensors from hand-written ratios."""

from __future__ import annotations

import math

import torch

from lit_asyncrl.losses import LossInputs, LossOutput, get_loss

BEHAVIOR_PROB = 0.3  # mu_old of every hand-built token; only ratios matter


def log(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).log()


def tensor(values, dtype=torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def inputs_from_ratios(
    policy_ratio,
    advantages,
    *,
    reference_ratio=None,
    loss_mask=None,
    version_gap=None,
) -> LossInputs:
    """Inputs with ``pi_theta/mu_old = policy_ratio`` and ``pi_ref/mu_old = reference_ratio``.

    ``mu_old`` is 0.3 everywhere; ``[T]`` lists are promoted to ``[1, T]``.
    """

    def rows(values):
        return values if isinstance(values[0], (list, tuple)) else [values]

    policy_ratio = rows(policy_ratio)
    behavior = torch.full((len(policy_ratio), len(policy_ratio[0])), math.log(BEHAVIOR_PROB), dtype=torch.float64)
    logprobs = (behavior + log(policy_ratio)).requires_grad_()
    ref = behavior + log(rows(reference_ratio)) if reference_ratio is not None else None
    mask = tensor(rows(loss_mask), torch.bool) if loss_mask is not None else torch.ones_like(behavior, dtype=torch.bool)
    gap = tensor(rows(version_gap), torch.long) if version_gap is not None else None
    return LossInputs(
        logprobs=logprobs,
        behavior_logprobs=behavior,
        advantages=tensor(rows(advantages)),
        loss_mask=mask,
        ref_logprobs=ref,
        version_gap=gap,
    )


def run(name: str, inputs: LossInputs, **kwargs) -> tuple[LossOutput, torch.Tensor]:
    """Loss output and ``d loss / d logprobs``."""
    if inputs.logprobs.grad is not None:
        inputs.logprobs.grad = None
    out = get_loss(name, **kwargs)(inputs)
    out.loss.backward()
    return out, inputs.logprobs.grad.clone()


def assert_close(actual, expected, tol: float = 1e-6) -> None:
    expected = torch.as_tensor(expected, dtype=torch.float64)
    actual = torch.as_tensor(actual, dtype=torch.float64)
    if expected.dim() == 1 and actual.dim() == 2 and actual.shape[0] == 1:
        actual = actual[0]
    torch.testing.assert_close(actual, expected, atol=tol, rtol=0)


def assert_mask(actual: torch.Tensor, expected) -> None:
    expected = torch.tensor(expected, dtype=torch.bool)
    if expected.dim() == 1:
        expected = expected.unsqueeze(0)
    assert actual.dtype == torch.bool
    assert torch.equal(actual, expected), f"{actual} != {expected}"
