"""Reference fidelity (`lit_asyncrl.fidelity`): the per-gap distances by hand, the proxy each strategy
uses, and the shadow inside a real Lightning fit on hand-made batches (no engine)."""

from __future__ import annotations

import math

import pytest
import torch

from lit_asyncrl.fidelity import fidelity_metrics
from lit_asyncrl.losses import (
    DecoupledPPO,
    LinearProx,
    LinearProxTrainInfer,
    LogLinearProx,
    LossInputs,
    PPOClip,
    PPOClipTrainInfer,
    available_losses,
    get_loss,
)
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.reference import AsyncRecomputeReference, SnapshotReference
from tests.support.batches import all_version, make_batch, own_logprobs
from tests.support.fakes import FakeRollouts
from tests.support.lightning import ListDataModule, PlainDataModule, RecordingLogger, make_trainer

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*does not have many workers.*",
    "ignore:.*dataloader_iter.*",
    "ignore:.*LeafSpec.*",
    "ignore:.*gives the current weights.*",
)


def test_distances_and_mask_disagreement_per_gap_by_hand():
    # one row, five tokens; token 4 is not a policy token (its huge error must not count)
    proxy = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -9.0]])
    exact = torch.tensor([[-1.0, -2.5, -0.25, -2.0, 0.0]])
    loss_mask = torch.tensor([[True, True, True, True, False]])
    gap = torch.tensor([[0, 1, 1, 5, 0]])
    applied = torch.tensor([[True, True, False, False, True]])
    exact_mask = torch.tensor([[True, False, False, True, True]])
    metrics = fidelity_metrics(proxy, exact, loss_mask, gap, applied, exact_mask)
    # |differences| = 0, 0.5, 0.25, 1.0 on gaps 0, 1, 1, 4plus
    assert metrics["fidelity/logratio_absmean"] == pytest.approx(1.75 / 4)
    assert metrics["fidelity/logratio_absmax"] == 1.0
    assert metrics["fidelity/logratio_absmean/gap_0"] == 0.0
    assert metrics["fidelity/logratio_absmean/gap_1"] == pytest.approx(0.375)
    assert metrics["fidelity/logratio_absmax/gap_1"] == 0.5
    assert metrics["fidelity/logratio_absmax/gap_4plus"] == 1.0
    assert "fidelity/logratio_absmean/gap_2" not in metrics  # no token there: absent, not 0
    # decisions differ on tokens 1 (gap 1) and 3 (gap 4plus)
    assert metrics["fidelity/mask_disagreement"] == 0.5
    assert metrics["fidelity/mask_disagreement/gap_0"] == 0.0
    assert metrics["fidelity/mask_disagreement/gap_1"] == 0.5
    assert metrics["fidelity/mask_disagreement/gap_4plus"] == 1.0


def test_non_finite_tokens_are_left_out_and_no_mask_means_no_disagreement_key():
    proxy = torch.tensor([[-1.0, math.nan, -1.0]])
    exact = torch.tensor([[-1.5, -1.0, -1.0]])
    loss_mask = torch.ones(1, 3, dtype=torch.bool)
    finite = torch.tensor([[True, True, False]])
    metrics = fidelity_metrics(proxy, exact, loss_mask, torch.zeros(1, 3, dtype=torch.long), loss_mask, None, finite)
    assert metrics["fidelity/logratio_absmean"] == 0.5 and metrics["fidelity/logratio_absmax"] == 0.5
    assert not any("mask_disagreement" in key for key in metrics)


def _inputs(ref=None, gap=(0, 1, 3)) -> LossInputs:
    mu = torch.log(torch.tensor([[0.5, 0.2, 0.4]], dtype=torch.float64))
    pi = torch.log(torch.tensor([[0.5, 0.6, 0.8]], dtype=torch.float64)).requires_grad_()
    return LossInputs(
        logprobs=pi,
        behavior_logprobs=mu,
        advantages=torch.ones(1, 3, dtype=torch.float64),
        loss_mask=torch.ones(1, 3, dtype=torch.bool),
        ref_logprobs=ref,
        version_gap=torch.tensor([list(gap)]),
    )


def test_each_strategy_reports_the_proxy_it_uses_in_place_of_pi_old():
    ref = torch.log(torch.tensor([[0.45, 0.3, 0.7]], dtype=torch.float64))
    mu = [0.5, 0.2, 0.4]
    # a reference source's pi_ref where the strategy reads one ...
    assert torch.equal(DecoupledPPO().proxy_logprobs(_inputs(ref)), ref)
    assert torch.equal(PPOClip().proxy_logprobs(_inputs(ref)), ref)
    # ... mu_old where it has none or ignores it
    assert torch.allclose(PPOClip().proxy_logprobs(_inputs()).exp(), torch.tensor([mu], dtype=torch.float64))
    assert torch.allclose(
        PPOClipTrainInfer().proxy_logprobs(_inputs(ref)).exp(), torch.tensor([mu], dtype=torch.float64)
    )
    # interpolations with alpha = 1/(n+1), gaps 0, 1, 3: alpha 1, 1/2, 1/4
    linear = [0.5, 0.5 * 0.2 + 0.5 * 0.6, 0.25 * 0.4 + 0.75 * 0.8]  # 0.5, 0.4, 0.7
    assert torch.allclose(LinearProx().proxy_logprobs(_inputs(ref)).exp(), torch.tensor([linear], dtype=torch.float64))
    loglinear = [0.5, math.sqrt(0.2 * 0.6), 0.4**0.25 * 0.8**0.75]
    assert torch.allclose(
        LogLinearProx().proxy_logprobs(_inputs()).exp(), torch.tensor([loglinear], dtype=torch.float64)
    )


def test_the_mask_under_exact_old_logprobs_uses_the_strategy_s_own_bounds():
    inputs = _inputs(torch.log(torch.tensor([[0.5, 0.2, 0.4]], dtype=torch.float64)))  # pi_ref == mu: all kept
    exact = torch.log(torch.tensor([[0.5, 0.3, 0.39]], dtype=torch.float64))  # r_d = 1, 1.5, 0.975
    bounds = (0.95, 1.05)
    mask = DecoupledPPO(discrepancy_bounds=bounds).discrepancy_mask_under(inputs, exact)
    assert mask.tolist() == [[True, False, True]]
    # linear_prox & train_infer masks pi_old / mu instead of pi_prox / mu
    mask = LinearProxTrainInfer(discrepancy_bounds=bounds).discrepancy_mask_under(inputs, exact)
    assert mask.tolist() == [[True, False, True]]
    # no r_d mask at all: nothing to disagree on
    assert PPOClipTrainInfer().discrepancy_mask_under(inputs, exact) is None
    assert LinearProx().discrepancy_mask_under(inputs, exact) is None
    assert PPOClip().discrepancy_mask_under(inputs, exact) is None


def _fit(module: AsyncRLModule, batches: list[dict]) -> RecordingLogger:
    logger = RecordingLogger()
    trainer = make_trainer(len(batches), [], logger=logger)
    trainer.fit(module, datamodule=ListDataModule(batches, FakeRollouts()))
    return logger


def test_shadow_measures_mu_against_exact_old_logprobs_for_plain_ppo():
    torch.manual_seed(0)
    module = AsyncRLModule(loss=PPOClipTrainInfer(), lr=1e-3, fidelity=True)
    mu = own_logprobs(module) + 0.05  # the engine 0.05 nats off the trainer on every token
    logger = _fit(module, [make_batch(all_version(0), [1.0, 0.0, 1.0, 0.0], behavior=mu)])
    row = logger.keys_at(0)
    assert row["fidelity/logratio_absmean/gap_0"] == pytest.approx(0.05, abs=1e-5)
    assert row["fidelity/logratio_absmax/gap_0"] == pytest.approx(0.05, abs=1e-5)
    assert not any("mask_disagreement" in key for key in row)  # ppo_clip_train_infer has no r_d mask


def test_shadow_finds_async_recompute_exact_at_gap_0_and_off_at_gap_1():
    torch.manual_seed(0)
    module = AsyncRLModule(
        loss=DecoupledPPO(discrepancy_bounds=(0.999, 1.001)),
        reference=AsyncRecomputeReference(),
        lr=1e-2,
        fidelity=True,
    )
    mu = own_logprobs(module)
    step0 = make_batch(all_version(0), [1.0, 0.0, 1.0, 0.0], behavior=mu)
    step1 = make_batch(
        {0: [0, 0, 0], 1: [1, 1], 2: [0], 3: [1, 1]}, [1.0, 0.0, 0.0, 1.0], behavior=mu
    )  # rows 0, 2 stale
    logger = _fit(module, [step0, step1])
    first, second = logger.keys_at(0), logger.keys_at(1)
    assert first["fidelity/logratio_absmax/gap_0"] < 1e-6
    assert first["fidelity/mask_disagreement/gap_0"] == 0.0
    assert second["fidelity/logratio_absmax/gap_0"] < 1e-6  # current weights = pi_old of the newest version
    assert second["fidelity/logratio_absmean/gap_1"] > 1e-3  # the current weights are not version 0's
    # mu is version 0's own log-prob: the exact mask keeps every gap-1 token, the recompute drops some
    assert second["fidelity/mask_disagreement/gap_1"] > 0.0


def test_shadow_agrees_with_an_exact_reference_at_every_gap():
    torch.manual_seed(0)
    module = AsyncRLModule(loss=DecoupledPPO(), reference=SnapshotReference(), lr=1e-2, fidelity=True)
    mu = own_logprobs(module)
    batches = [
        make_batch(all_version(0), [1.0, 0.0, 1.0, 0.0], behavior=mu),
        make_batch({0: [0, 0, 1], 1: [1, 1], 2: [0], 3: [1, 1]}, [1.0, 0.0, 0.0, 1.0], behavior=mu),
        make_batch({0: [0, 1, 2], 1: [2, 2], 2: [1], 3: [0, 2]}, [0.0, 1.0, 0.0, 1.0], behavior=mu),
    ]
    logger = _fit(module, batches)
    values = {
        key: value
        for step in (0, 1, 2)
        for key, value in logger.keys_at(step).items()
        if key.startswith("fidelity/logratio")
    }
    assert {"fidelity/logratio_absmax/gap_1", "fidelity/logratio_absmax/gap_2"} <= set(values)
    assert max(values.values()) <= 1e-6
    assert (
        max(value for step in (0, 1, 2) for key, value in logger.keys_at(step).items() if "mask_disagreement" in key)
        == 0.0
    )


def test_the_shadow_also_runs_without_a_rollout_service():
    torch.manual_seed(0)
    module = AsyncRLModule(loss=PPOClipTrainInfer(), lr=1e-3, fidelity=True)
    mu = own_logprobs(module)
    batches = [
        make_batch(all_version(0), [1.0, 0.0, 1.0, 0.0], behavior=mu),
        make_batch(all_version(0), [1.0, 0.0, 1.0, 0.0], behavior=mu),
    ]
    logger = RecordingLogger()
    make_trainer(2, [], logger=logger).fit(module, datamodule=PlainDataModule(batches))
    # step 1 trains version-0 tokens at version 1: mu is version 0's own log-prob, the exact pi_old
    assert logger.keys_at(1)["fidelity/logratio_absmax/gap_1"] < 1e-6


@pytest.mark.parametrize("name", available_losses())
def test_every_strategy_masks_its_own_proxy_as_it_masks_in_the_loss(name):
    # With its own proxy standing in as "exact" pi_old, a strategy's mask must be the one it applied:
    # otherwise mask_disagreement would measure the bookkeeping, not the reference.
    generator = torch.Generator().manual_seed(3)
    mu = -torch.rand(4, 16, generator=generator, dtype=torch.float64) * 3
    inputs = LossInputs(
        logprobs=(mu + torch.randn(4, 16, generator=generator, dtype=torch.float64)).requires_grad_(),
        behavior_logprobs=mu,
        advantages=torch.randn(4, 1, generator=generator, dtype=torch.float64).expand(4, 16).clone(),
        loss_mask=torch.rand(4, 16, generator=generator) < 0.8,
        # per-token noise and a per-row offset: token-level and sequence-level masks each drop some, keep some
        ref_logprobs=mu
        + 0.5 * torch.randn(4, 16, generator=generator, dtype=torch.float64)
        + torch.tensor([[-1.0], [0.0], [1.0], [0.0]], dtype=torch.float64),
        version_gap=torch.randint(0, 4, (4, 16), generator=generator),
    )
    loss_fn = get_loss(name)
    applied = loss_fn(inputs).discrepancy_mask
    under_own_proxy = loss_fn.discrepancy_mask_under(inputs, loss_fn.proxy_logprobs(inputs))
    if under_own_proxy is not None:
        assert torch.equal(under_own_proxy, applied)
        assert 0 < int(applied.sum()) < int(inputs.loss_mask.sum())  # the inputs exercise the mask both ways
