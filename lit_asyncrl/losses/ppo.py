"""PPO-clip rows of Table 1: no discrepancy ratio (``r_d = 1``), one clipped ratio."""

from __future__ import annotations

from lit_asyncrl.losses.base import ClippedLossStrategy, TokenTerms
from lit_asyncrl.losses.inputs import PreparedInputs
from lit_asyncrl.losses.ratios import clipped_surrogate, ratio
from lit_asyncrl.losses.registry import register_loss


@register_loss("ppo_clip")
class PPOClip(ClippedLossStrategy):
    """Table 1 "PPO-clip (standard)": ``r_d = 1``, ``r_s = pi_theta / pi_ref`` (Eq. 3, Sec. 3.1).

    ``min(r_s A, clip(r_s, low, high) A)`` with ``pi_ref = ref_logprobs`` when given (exact old logits
    or the EWMA reference, which makes this the "PPO-EWMA" row), else ``mu_old``.

    Args:
        clip_bounds: ``(low, high)`` ratio bounds of the trust region, e.g. ``(0.8, 1.2)``.
        aggregation, normalizer: see :func:`lit_asyncrl.losses.aggregation.aggregate`.
    """

    reference_use = "optional"

    def token_terms(self, inputs: PreparedInputs) -> TokenTerms:
        staleness_ratio = ratio(inputs.logprobs, inputs.anchor_logprobs)  # [B, T]
        objective, inside = clipped_surrogate(staleness_ratio, inputs.advantages, self.clip_bounds)
        return TokenTerms(objective=objective, discrepancy_mask=None, clip_mask=inside)


@register_loss("ppo_clip_train_infer")
class PPOClipTrainInfer(PPOClip):
    """Table 1 "PPO-clip & train_infer": ``r_d = 1``, ``r_s = pi_theta / mu_old``.

    The whole train-infer ratio goes through the one PPO clip (no separate discrepancy mask, exactly
    as in Table 1); ``ref_logprobs`` is ignored even when given.
    """

    reference_use = "ignored"
