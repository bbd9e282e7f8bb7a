"""The KL penalty to the model as loaded (`model.kl_coef`): estimators by hand, pi_init with and
without a LoRA adapter, and the term in a real training step."""

import math

import pytest
import torch

from lit_asyncrl.kl_penalty import KLPenalty, per_token_kl
from lit_asyncrl.losses import PPOClip
from lit_asyncrl.models.policy import load_policy
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.scoring import token_logprobs
from tests.support.batches import all_version, make_batch
from tests.support.lightning import PlainDataModule, StepMetrics, make_trainer
from tests.support.lora import adapted


def test_the_estimators_by_hand():
    logprobs = torch.tensor([[math.log(0.5), math.log(0.2)]])
    initial = torch.tensor([[math.log(0.25), math.log(0.2)]])
    # x = log pi_init - log pi = -log 2 on the first token, 0 on the second.
    torch.testing.assert_close(per_token_kl(logprobs, initial, "k1"), torch.tensor([[math.log(2), 0.0]]))
    torch.testing.assert_close(per_token_kl(logprobs, initial, "k3"), torch.tensor([[0.5 + math.log(2) - 1, 0.0]]))


def batch_of(input_ids):
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "loss_mask": torch.ones_like(input_ids, dtype=torch.bool),
        "temperature": 1.0,
        "top_k": -1,
    }


def test_the_term_is_zero_at_the_initial_weights_and_grows_with_a_gradient_after_a_change(model_path):
    policy = load_policy(model_path)
    penalty = KLPenalty(0.1, "k3", model_path)
    batch = batch_of(torch.randint(3, 20, (2, 7), generator=torch.Generator().manual_seed(0)))
    term, mean = penalty.loss(policy, batch, token_logprobs(policy, batch["input_ids"], batch["attention_mask"], 1.0))
    assert mean == 0.0 and float(term) == 0.0
    with torch.no_grad():
        policy.model.embed_tokens.weight.add_(0.3 * torch.randn_like(policy.model.embed_tokens.weight))
    logprobs = token_logprobs(policy, batch["input_ids"], batch["attention_mask"], 1.0)
    term, mean = penalty.loss(policy, batch, logprobs)
    assert mean > 1e-3 and float(term) == pytest.approx(0.1 * mean)
    term.backward()
    assert policy.model.embed_tokens.weight.grad.abs().sum() > 0


def test_with_an_adapter_pi_init_is_the_base_model_and_nothing_is_copied(model_path):
    policy = adapted(model_path)  # B random: the adapted policy differs from the base
    penalty = KLPenalty(0.1, "k1", model_path)
    batch = batch_of(torch.randint(3, 20, (2, 7), generator=torch.Generator().manual_seed(1)))
    base = load_policy(model_path).eval()
    with torch.no_grad():
        expected = token_logprobs(base, batch["input_ids"], batch["attention_mask"], 1.0)
        adapted_logprobs = token_logprobs(policy, batch["input_ids"], batch["attention_mask"], 1.0)
    initial = penalty.initial_logprobs(policy, batch)
    torch.testing.assert_close(initial, expected, rtol=0, atol=1e-6)
    assert (adapted_logprobs - expected).abs().max() > 1e-3  # the adapter is on again after it
    assert penalty._initial is None


def test_a_training_step_adds_the_term_and_logs_it(model_path):
    torch.manual_seed(0)
    module = AsyncRLModule(loss=PPOClip(), lr=1e-2, kl_coef=0.5, kl_estimator="k1")
    metrics = StepMetrics()
    trainer = make_trainer(2, [metrics])
    batch = make_batch(all_version(0), [1.0, 0.0, 0.0, 1.0])
    trainer.fit(module, datamodule=PlainDataModule([batch, batch]))
    first, second = (step["train/kl_to_initial"] for step in metrics.per_step)
    assert first == 0.0  # the first step's policy is the model as loaded
    assert second != 0.0  # the second step's is one update away from it


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kl_coef": 0.1, "kl_estimator": "k2"}, "model.kl_estimator must be one of k1, k3, got 'k2'"),
        ({"kl_estimator": "k2"}, "model.kl_estimator must be one of k1, k3, got 'k2'"),
        ({"kl_coef": -1.0}, "model.kl_coef must be >= 0"),
    ],
)
def test_bad_kl_settings_are_refused_naming_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AsyncRLModule(**kwargs)
