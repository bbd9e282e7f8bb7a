"""Under DDP each rank's loss is scaled so that the averaged gradient is the global batch's."""

import pytest
import torch

from lit_asyncrl.losses import LossInputs, PPOClipTrainInfer
from lit_asyncrl.losses.aggregation import aggregation_denominator, global_batch_scale

# Four episodes of very different lengths: rank 0 gets the first (1 policy token), rank 1 the rest.
LENGTHS = [1, 5, 3, 4]
T = 6


def make_inputs(seed: int = 0) -> tuple[LossInputs, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    loss_mask = torch.zeros(len(LENGTHS), T, dtype=torch.bool)
    for row, length in enumerate(LENGTHS):
        loss_mask[row, :length] = True
    logits = torch.randn(len(LENGTHS), T, generator=generator) * 0.05 - 1.0
    logprobs = logits.clone().requires_grad_(True)
    behavior = (logits + torch.randn(len(LENGTHS), T, generator=generator) * 0.02) * loss_mask
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.0])[:, None] * loss_mask
    inputs = LossInputs(
        logprobs=logprobs,
        behavior_logprobs=behavior,
        advantages=advantages,
        loss_mask=loss_mask,
        ref_logprobs=None,
        version_gap=torch.zeros(len(LENGTHS), T, dtype=torch.long),
    )
    return inputs, logprobs


def shard(inputs: LossInputs, logprobs: torch.Tensor, rows: slice) -> LossInputs:
    return LossInputs(
        logprobs=logprobs[rows],
        behavior_logprobs=inputs.behavior_logprobs[rows],
        advantages=inputs.advantages[rows],
        loss_mask=inputs.loss_mask[rows],
        ref_logprobs=None,
        version_gap=inputs.version_gap[rows],
    )


def ddp_gradient(loss_fn, scaled: bool) -> torch.Tensor:
    """What DDP's averaged gradient would be with the batch dealt as rows [0] and [1, 2, 3]."""
    inputs, logprobs = make_inputs()
    shards = [slice(0, 1), slice(1, 4)]
    outputs = [loss_fn(shard(inputs, logprobs, rows)) for rows in shards]
    denominators = [
        aggregation_denominator(out.valid, loss_fn.aggregation) if loss_fn.aggregation != "fixed" else torch.tensor(0.0)
        for out in outputs
    ]
    total = sum(denominators)
    losses = []
    for out in outputs:
        scale = global_batch_scale(out.valid, loss_fn.aggregation, 2, lambda local: total) if scaled else 1.0
        losses.append(out.loss * scale)
    (sum(losses) / 2).backward()  # DDP averages the ranks' gradients
    return logprobs.grad


@pytest.mark.parametrize(
    "aggregation,normalizer",
    [("token_mean", None), ("seq_mean_token_mean", None), ("seq_mean_token_sum", None), ("fixed", 64.0)],
)
def test_scaled_rank_losses_give_the_global_batch_gradient(aggregation, normalizer):
    loss_fn = PPOClipTrainInfer(aggregation=aggregation, normalizer=normalizer)
    inputs, logprobs = make_inputs()
    loss_fn(inputs).loss.backward()
    single_process = logprobs.grad
    assert single_process.abs().sum() > 0

    torch.testing.assert_close(ddp_gradient(loss_fn, scaled=True), single_process, rtol=1e-5, atol=1e-7)
    # Without the scale the short shard's tokens weigh far more than they should.
    assert not torch.allclose(ddp_gradient(loss_fn, scaled=False), single_process, rtol=1e-3, atol=1e-6)


def test_denominators_count_tokens_or_sequences_with_a_token():
    valid = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])
    assert aggregation_denominator(valid, "token_mean").item() == 3.0
    assert aggregation_denominator(valid, "seq_mean_token_mean").item() == 2.0
    assert global_batch_scale(valid, "token_mean", 2, lambda local: local + 9.0).item() == pytest.approx(2 * 3 / 12)
    assert global_batch_scale(valid, "fixed", 4, lambda local: local).item() == 4.0
