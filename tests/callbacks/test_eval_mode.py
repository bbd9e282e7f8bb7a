"""Reference forwards with dropout off, in a plain Lightning project with a GPT-2-shaped model (Hugging
Face's default dropout of 0.1): each callback's pi_old or pi_ref equals a copy of the model at that
version in eval mode, while the module itself stays in the mode it was in."""

import copy
from types import SimpleNamespace

import pytest
import torch
from asyncrl_callbacks import EWMAReference, InterruptSync, SnapshotRetention
from asyncrl_callbacks.eval_mode import evaluation_mode
from lightning.pytorch import LightningModule
from transformers import GPT2Config, GPT2LMHeadModel


def gpt2_with_dropout() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=23, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    assert (config.resid_pdrop, config.embd_pdrop, config.attn_pdrop) == (0.1, 0.1, 0.1)  # the library's defaults
    return GPT2LMHeadModel(config).train()


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(-1).gather(-1, input_ids[..., None]).squeeze(-1)


def in_eval_mode(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """The oracle: log-probs of a deep copy of `model` in eval mode."""
    with torch.no_grad():
        return token_logprobs(copy.deepcopy(model).eval()(input_ids).logits, input_ids)


def move(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))


@pytest.fixture
def input_ids() -> torch.Tensor:
    return torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(1))


def test_dropout_is_on_in_training_mode(input_ids):
    # Without this, the checks below could not fail: two training-mode forwards must differ.
    model = gpt2_with_dropout()
    with torch.no_grad():
        first, second = (token_logprobs(model(input_ids).logits, input_ids) for _ in range(2))
    assert (first - second).abs().max() > 1e-3


def test_evaluation_mode_gives_each_submodule_its_own_mode_back_however_the_block_ends():
    model = gpt2_with_dropout()
    model.transformer.h[0].eval()  # a part held in eval mode while the rest trains
    before = {name: module.training for name, module in model.named_modules()}
    with pytest.raises(RuntimeError), evaluation_mode(model):
        assert not any(module.training for module in model.modules())
        raise RuntimeError("a failing forward")
    assert {name: module.training for name, module in model.named_modules()} == before
    assert not model.transformer.h[0].training and model.transformer.h[1].training


def test_snapshot_pi_old_equals_an_eval_copy_at_each_version(input_ids):
    model, callback = gpt2_with_dropout(), SnapshotRetention(max_staleness=1)
    copies = {}
    for version in (0, 1):
        if version:
            move(model, version)
        callback.save_version(version, model)
        copies[version] = in_eval_mode(model, input_ids)
    token_versions = torch.tensor([[0] * 8, [1] * 8])
    loss_mask = torch.ones(2, 8, dtype=torch.bool)

    def score(forward, rows):
        return token_logprobs(forward(input_ids[rows]).logits, input_ids[rows])

    pi_old = callback.historical_logprobs(token_versions, loss_mask, score, module=model)
    torch.testing.assert_close(pi_old[0], copies[0][0], rtol=0, atol=1e-6)
    torch.testing.assert_close(pi_old[1], copies[1][1], rtol=0, atol=1e-6)
    assert model.training and all(module.training for module in model.modules())


def test_ewma_reference_equals_an_eval_copy_with_the_averaged_weights(input_ids):
    model = gpt2_with_dropout()
    ewma = EWMAReference(beta=0.5)
    ewma.attach(model)
    move(model, 1)
    ewma.update()  # the average now sits between the two versions
    average = copy.deepcopy(model)
    average.load_state_dict(ewma.averaged_parameters, strict=False)
    with torch.no_grad():
        reference = token_logprobs(ewma.reference_forward(input_ids).logits, input_ids)
    torch.testing.assert_close(reference, in_eval_mode(average, input_ids), rtol=0, atol=1e-6)
    assert (reference - in_eval_mode(model, input_ids)).abs().max() > 1e-4  # an average, not the live weights
    assert all(module.training for module in model.modules())


class ScoringRollouts:
    """Rollouts with one unscored sequence: `score_unscored` scores it with the callback's score_fn."""

    def __init__(self, input_ids: torch.Tensor) -> None:
        self.input_ids, self.scored, self.paused = input_ids, None, False

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def score_unscored(self, score_fn, version: int) -> int:
        self.scored = token_logprobs(score_fn(self.input_ids, torch.ones_like(self.input_ids)), self.input_ids)
        return self.input_ids.numel()


class Holder(LightningModule):
    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy


def test_interrupt_sync_scores_with_an_eval_copy_of_the_live_weights(input_ids):
    holder, rollouts = Holder(gpt2_with_dropout()), ScoringRollouts(input_ids)
    callback = InterruptSync(rollouts=rollouts, module_attr="policy")
    callback.on_before_optimizer_step(SimpleNamespace(global_step=3), holder, optimizer=None)
    torch.testing.assert_close(rollouts.scored, in_eval_mode(holder.policy, input_ids), rtol=0, atol=1e-6)
    assert callback.last_scored_tokens == 16 and all(module.training for module in holder.modules())
