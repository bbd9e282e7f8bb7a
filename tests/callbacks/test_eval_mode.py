"""Reference forwards with dropout off, in a plain Lightning project with a GPT-2-shaped model (Hugging
Face's default dropout of 0.1): each callback's pi_old or pi_ref equals a copy of the model at that
version in eval mode, while the module itself stays in the mode it was in."""

import copy
from types import SimpleNamespace

import pytest
import torch
from asyncrl_callbacks import EWMAReference, InterruptSync, SnapshotRetention
from asyncrl_callbacks.eval_mode import evaluation_mode, has_active_dropout
from lightning.pytorch import LightningModule, Trainer
from torch.nn.modules.dropout import _DropoutNd
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def gpt2_with_dropout(**dropouts: float) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=23, n_positions=16, n_embd=16, n_layer=2, n_head=2, **dropouts)
    if not dropouts:
        assert (config.resid_pdrop, config.embd_pdrop, config.attn_pdrop) == (0.1, 0.1, 0.1)  # the library's defaults
    return GPT2LMHeadModel(config).train()


#: Every dropout setting of GPT2Config at 0, as lit_asyncrl's `load_policy` leaves a model.
NO_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0)


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


# ----------------------------------------------- the newest version, with the caller's current_logprobs


def score_with(input_ids: torch.Tensor):
    def score(forward, rows):
        return token_logprobs(forward(input_ids[rows]).logits, input_ids[rows])

    return score


class DropoutAgent(LightningModule):
    """A plain Lightning project: the policy trains in training mode (dropout on). At the step with
    versions 0..3 resident, row b of the batch is sampled by version 3 - b (gaps 0, 1, 2, 3), and pi_old
    is asked for as the docstring invites, with the step's own training-mode log-probs as
    `current_logprobs`; the oracle is a deep copy of the policy kept at each version, in eval mode."""

    def __init__(self, snapshots: SnapshotRetention) -> None:
        super().__init__()
        self.policy, self.snapshots = gpt2_with_dropout(), snapshots
        self.copies: dict[int, torch.nn.Module] = {}
        self.checked: dict[str, object] = {}

    def on_train_start(self) -> None:
        self.copies[self.global_step] = copy.deepcopy(self.policy)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:  # after the callbacks' hook
        self.copies[self.global_step] = copy.deepcopy(self.policy)

    def training_step(self, batch, batch_idx):
        (input_ids,) = batch
        logprobs = token_logprobs(self.policy(input_ids).logits, input_ids)  # training mode: dropout on
        if self.global_step == 3:
            token_versions = torch.tensor([3, 2, 1, 0])[:, None].expand_as(input_ids)  # row b: gap b
            loss_mask = torch.ones_like(input_ids, dtype=torch.bool)
            forwards = self.snapshots.num_historical_forwards
            pi_old = self.snapshots.historical_logprobs(
                token_versions, loss_mask, score_with(input_ids), current_logprobs=logprobs.detach()
            )
            expected = torch.cat([in_eval_mode(self.copies[3 - b], input_ids[b, None]) for b in range(4)])
            self.checked = {
                "pi_old": pi_old,
                "expected": expected,
                "current": logprobs.detach(),
                "forwards": self.snapshots.num_historical_forwards - forwards,
                "training": [module.training for module in self.policy.modules()],
            }
        return -logprobs.mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1.0)


def test_snapshot_pi_old_is_exact_at_gaps_0_to_3_with_training_mode_current_logprobs(tmp_path):
    snapshots = SnapshotRetention(max_staleness=3, module_attr="policy")
    agent = DropoutAgent(snapshots)
    torch.manual_seed(3)
    data = DataLoader(TensorDataset(torch.randint(0, 23, (16, 8))), batch_size=4)
    trainer = Trainer(
        max_steps=4,
        accelerator="cpu",
        callbacks=[snapshots],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(agent, data)
    checked = agent.checked
    pi_old, expected, current = checked["pi_old"], checked["expected"], checked["current"]
    for gap in range(4):  # row `gap` holds the tokens of version 3 - gap
        torch.testing.assert_close(pi_old[gap], expected[gap], rtol=0, atol=1e-5, msg=lambda m, g=gap: f"gap {g}: {m}")
    # The versions differ, and the step's own log-probs (dropout on) are not the newest version's pi_old:
    # without the eval-mode forward, gap 0 would be off by this much.
    assert (expected[0] - expected[3]).abs().max() > 0.01
    assert (current[0] - expected[0]).abs().max() > 0.01
    assert checked["forwards"] == 4  # the newest version too: its tokens get an eval-mode forward
    assert all(checked["training"])  # the policy is still in training mode after the call


def four_saved_versions(model, callback: SnapshotRetention, input_ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Versions 0..3 of `model` (each moved from the last) saved in `callback`; each one's eval-mode log-probs."""
    expected = {}
    for version in range(4):
        if version:
            move(model, version)
        callback.save_version(version, model)
        expected[version] = in_eval_mode(model, input_ids)
    return expected


def test_without_dropout_the_current_logprobs_stand_in_for_the_newest_forward():
    model, callback = gpt2_with_dropout(**NO_DROPOUT), SnapshotRetention(max_staleness=3)
    input_ids = torch.randint(0, 23, (4, 8), generator=torch.Generator().manual_seed(1))
    expected = four_saved_versions(model, callback, input_ids)
    assert not has_active_dropout(model) and model.training
    current = token_logprobs(model(input_ids).logits, input_ids)  # training mode, with grad
    token_versions = torch.tensor([3, 2, 1, 0])[:, None].expand_as(input_ids)
    loss_mask = torch.ones_like(input_ids, dtype=torch.bool)
    pi_old = callback.historical_logprobs(token_versions, loss_mask, score_with(input_ids), current_logprobs=current)
    assert callback.num_historical_forwards == 3  # gaps 1, 2 and 3; gap 0 took the caller's log-probs
    assert torch.equal(pi_old[0], current[0].detach())
    for gap in range(4):
        torch.testing.assert_close(pi_old[gap], expected[3 - gap][gap], rtol=0, atol=1e-5)


def test_with_dropout_current_logprobs_the_caller_scored_in_eval_mode_save_the_newest_forward():
    # A caller that scores the live weights in eval mode itself says so: the newest version takes its
    # log-probs though the module drops; the older versions still get their eval-mode forwards.
    model, callback = gpt2_with_dropout(), SnapshotRetention(max_staleness=3)
    input_ids = torch.randint(0, 23, (4, 8), generator=torch.Generator().manual_seed(1))
    expected = four_saved_versions(model, callback, input_ids)
    assert has_active_dropout(model) and model.training
    token_versions = torch.tensor([3, 2, 1, 0])[:, None].expand_as(input_ids)
    loss_mask = torch.ones_like(input_ids, dtype=torch.bool)
    live = expected[3]  # what the caller's own eval-mode forward gave
    pi_old = callback.historical_logprobs(
        token_versions, loss_mask, score_with(input_ids), current_logprobs=live, current_logprobs_without_dropout=True
    )
    assert callback.num_historical_forwards == 3  # gaps 1, 2 and 3 only
    assert torch.equal(pi_old[0], live[0])
    for gap in range(1, 4):
        torch.testing.assert_close(pi_old[gap], expected[3 - gap][gap], rtol=0, atol=1e-5)
    # Not said: the caller's log-probs may be a dropout sample, and the newest version gets a forward too.
    callback.historical_logprobs(token_versions, loss_mask, score_with(input_ids), current_logprobs=live)
    assert callback.num_historical_forwards == 3 + 4


class FunctionalDropout(torch.nn.Module):
    """nanoGPT-style: the probability is a plain attribute, handed to sdpa's `dropout_p`."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout
        self.proj = torch.nn.Linear(4, 4)


class ConfigDropout(torch.nn.Module):
    """Falcon-style: the forward reads the probability from `self.config` at call time."""

    def __init__(self, hidden_dropout: float) -> None:
        super().__init__()
        self.config = SimpleNamespace(hidden_dropout=hidden_dropout, hidden_size=4)
        self.proj = torch.nn.Linear(4, 4)


def llama(**config: float) -> LlamaForCausalLM:
    settings = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    return LlamaForCausalLM(LlamaConfig(vocab_size=23, num_key_value_heads=2, **settings, **config)).train()


@pytest.mark.parametrize(
    ("build", "active"),
    [
        pytest.param(gpt2_with_dropout, True, id="gpt2-layers"),  # nn.Dropout(0.1) layers in training mode
        pytest.param(lambda: gpt2_with_dropout().eval(), False, id="gpt2-eval"),
        pytest.param(lambda: gpt2_with_dropout(**NO_DROPOUT), False, id="gpt2-no-dropout"),
        # A config value counts even where no layer of this model reads it (the double-heads model's).
        pytest.param(lambda: gpt2_with_dropout(**NO_DROPOUT | {"summary_first_dropout": 0.1}), True, id="gpt2-config"),
        pytest.param(lambda: llama(attention_dropout=0.1), True, id="llama-functional"),  # no dropout layer
        pytest.param(lambda: llama(attention_dropout=0.1).eval(), False, id="llama-eval"),
        pytest.param(llama, False, id="llama-default"),  # attention_dropout defaults to 0
        pytest.param(lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.0)), False, id="p-0"),
        pytest.param(lambda: FunctionalDropout(0.1), True, id="attribute"),
        pytest.param(lambda: FunctionalDropout(0.0), False, id="attribute-0"),
        pytest.param(lambda: ConfigDropout(0.1), True, id="config"),
        pytest.param(lambda: ConfigDropout(0.1).eval(), False, id="config-eval"),
        pytest.param(lambda: ConfigDropout(0.0), False, id="config-0"),
    ],
)
def test_has_active_dropout(build, active):
    assert has_active_dropout(build()) is active


def test_llama_attention_dropout_has_no_dropout_layer():
    # Why a layer check alone is not enough: it would miss Llama's (and Qwen's) attention dropout.
    assert not any(isinstance(module, _DropoutNd) for module in llama(attention_dropout=0.1).modules())
