"""Several proxies measured in one run's fidelity shadow: distances and mask decisions by hand, and an
EWMA of the panel's own against an average of the weights recorded at each version."""

from __future__ import annotations

import copy
import math

import lightning as L
import pytest
import torch

from lit_asyncrl.fidelity_panel import ProxyPanel
from lit_asyncrl.losses import DecoupledPPO, LossInputs
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.reference import SnapshotReference
from tests.support.batches import TEMPERATURE, TOP_K, all_version, make_batch, own_logprobs
from tests.support.fakes import FakeRollouts
from tests.support.lightning import ListDataModule, RecordingLogger, make_trainer


def _log(values: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor([values], dtype=torch.float64))


def test_distances_discrepancy_and_mask_decisions_of_each_proxy_by_hand():
    # three tokens of version gaps 0, 1 and 3
    mu, pi_theta, exact = _log([0.5, 0.2, 0.4]), _log([0.5, 0.4, 0.1]), _log([0.5, 0.25, 0.4])
    inputs = LossInputs(
        pi_theta,
        mu,
        torch.ones(1, 3, dtype=torch.float64),
        torch.ones(1, 3, dtype=torch.bool),
        None,
        torch.tensor([[0, 1, 3]]),
    )
    panel = ProxyPanel(["async_recompute", "linear_prox"])
    metrics = panel.metrics(DecoupledPPO(discrepancy_bounds=(0.95, 1.05)), inputs, exact, {}, 5, inputs.loss_mask)

    assert not any(key.startswith("fidelity/discrepancy_") for key in metrics)  # the shadow's, logged without a panel
    # async recompute: pi_theta against pi_old
    assert metrics["fidelity/async_recompute/logratio_absmean/gap_0"] == 0.0
    assert metrics["fidelity/async_recompute/logratio_absmean/gap_1"] == pytest.approx(math.log(0.4 / 0.25))
    assert metrics["fidelity/async_recompute/logratio_absmean/gap_3"] == pytest.approx(math.log(4.0))
    # linear interpolation, alpha = 1/(n+1): pi_prox = 0.5, 0.5*0.2 + 0.5*0.4 = 0.3, 0.25*0.4 + 0.75*0.1 = 0.175
    assert metrics["fidelity/linear_prox/logratio_absmean/gap_1"] == pytest.approx(math.log(0.3 / 0.25))
    assert metrics["fidelity/linear_prox/logratio_absmean/gap_3"] == pytest.approx(math.log(0.4 / 0.175))
    # masks in (0.95, 1.05): exact r_d = 1, 1.25, 1 keeps tokens 0 and 2; pi_theta / mu = 1, 2, 0.25 and
    # pi_prox / mu = 1, 1.5, 0.4375 keep token 0 only: they disagree on the gap-3 token alone
    for name in ("async_recompute", "linear_prox"):
        assert metrics[f"fidelity/{name}/mask_disagreement"] == pytest.approx(1 / 3)
        assert metrics[f"fidelity/{name}/mask_disagreement/gap_3"] == 1.0
        assert metrics[f"fidelity/{name}/mask_disagreement/gap_1"] == 0.0


@pytest.mark.parametrize(
    ("names", "fragment"),
    [
        (["ewma_1.5"], "fidelity_proxies: unknown proxy 'ewma_1.5'"),
        (["snapshot"], "fidelity_proxies: unknown proxy 'snapshot'"),
        (["ewma", "ewma"], "fidelity_proxies names a proxy twice"),
    ],
)
def test_bad_proxy_names_are_refused_naming_the_key(names, fragment):
    with pytest.raises(ValueError, match=fragment):
        ProxyPanel(names)


def test_proxies_without_the_shadow_are_refused():
    with pytest.raises(ValueError, match="fidelity_proxies are measured by the fidelity shadow: set fidelity=true"):
        AsyncRLModule(fidelity_proxies=["ewma"])


class RecordWeights(L.Callback):
    """The policy's weights at each version (before each step)."""

    def __init__(self) -> None:
        self.by_version: dict[int, dict[str, torch.Tensor]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.by_version[trainer.global_step] = copy.deepcopy(pl_module.policy.state_dict())


class EveryVersionLive(FakeRollouts):
    """Pending episodes hold every version so far (as in an async run): the shadow keeps them all."""

    def live_versions(self):
        return [0, 1, 2, 3]


def _token_logprobs(module: AsyncRLModule, weights: dict[str, torch.Tensor], batch: dict) -> torch.Tensor:
    policy = copy.deepcopy(module.policy)
    policy.load_state_dict(weights)
    from lit_asyncrl.scoring import token_logprobs

    with torch.no_grad():
        return token_logprobs(policy, batch["input_ids"], batch["attention_mask"], TEMPERATURE, TOP_K)


def test_a_fixed_decay_average_of_the_panel_equals_the_debiased_average_of_the_recorded_weights():
    torch.manual_seed(0)
    module = AsyncRLModule(
        loss=DecoupledPPO(),
        reference=SnapshotReference(),
        lr=1e-2,
        fidelity=True,
        fidelity_proxies=["async_recompute", "ewma_0.5", "ewma"],
    )
    mu = own_logprobs(module)
    batches = [
        make_batch(all_version(0), [1.0, 0.0, 1.0, 0.0], behavior=mu),
        make_batch({0: [0, 0, 1], 1: [1, 1], 2: [0], 3: [1, 1]}, [1.0, 0.0, 0.0, 1.0], behavior=mu),
        make_batch({0: [0, 1, 2], 1: [2, 2], 2: [1], 3: [0, 2]}, [0.0, 1.0, 0.0, 1.0], behavior=mu),
    ]
    logger, recorder = RecordingLogger(), RecordWeights()
    make_trainer(len(batches), [recorder], logger=logger).fit(
        module, datamodule=ListDataModule(batches, EveryVersionLive())
    )

    # At step 2 the average is (0.25 theta_0 + 0.5 theta_1 + theta_2) / 1.75; pi_old per token from each token's version.
    weights = recorder.by_version
    average = {
        name: (0.25 * weights[0][name] + 0.5 * weights[1][name] + weights[2][name]) / 1.75 for name in weights[2]
    }
    batch = batches[2]
    by_version = {version: _token_logprobs(module, weights[version], batch) for version in (0, 1, 2)}
    exact = torch.zeros_like(by_version[2])
    for version, logprobs in by_version.items():
        exact = torch.where(batch["versions"] == version, logprobs, exact)
    distance = (_token_logprobs(module, average, batch) - exact).abs()
    gap = 2 - batch["versions"]
    row = logger.keys_at(2)
    for n in (0, 1, 2):
        tokens = batch["loss_mask"] & (gap == n)
        assert row[f"fidelity/ewma_0.5/logratio_absmean/gap_{n}"] == pytest.approx(
            distance[tokens].mean().item(), abs=1e-6
        )
        # the current weights are exact for the newest version only
        drift = (by_version[2] - exact).abs()[tokens].mean().item()
        assert row[f"fidelity/async_recompute/logratio_absmean/gap_{n}"] == pytest.approx(drift, abs=1e-6)
    assert (
        row["fidelity/async_recompute/logratio_absmean/gap_0"]
        < 1e-6
        < row["fidelity/async_recompute/logratio_absmean/gap_2"]
    )
    # how far the last update moved the policy, on every policy token: version 2 against version 1
    step = (by_version[2] - by_version[1]).abs()[batch["loss_mask"]]
    assert row["fidelity/version_drift_absmean"] == pytest.approx(step.mean().item(), abs=1e-6)
    assert row["fidelity/version_drift_absmax"] == pytest.approx(step.max().item(), abs=1e-6)
    # beta = W/(W+2) with W the largest gap seen: 2 by the last batch, so 0.5
    betas = {proxy.name: proxy.average.beta for proxy in module.fidelity.panel.proxies if hasattr(proxy, "average")}
    assert betas == {"ewma_0.5": 0.5, "ewma": 0.5}


def test_the_drift_and_the_discrepancy_are_measured_by_the_shadow_alone_even_when_no_token_holds_v_minus_1():
    # No proxy panel: every run with the shadow states its own regime. FakeRollouts reports only version 0
    # alive: the shadow frees version 1 at step 2's exact scores, after the drift of step 2 (version 2
    # against version 1) was measured.
    torch.manual_seed(0)
    module = AsyncRLModule(loss=DecoupledPPO(), reference=SnapshotReference(), lr=1e-2, fidelity=True)
    mu = own_logprobs(module)
    batches = [
        make_batch(all_version(step), [1.0, 0.0, 1.0, 0.0], behavior=mu) for step in range(3)
    ]  # on-policy: gap 0
    logger, recorder = RecordingLogger(), RecordWeights()
    make_trainer(len(batches), [recorder], logger=logger).fit(
        module, datamodule=ListDataModule(batches, FakeRollouts())
    )
    for step in (1, 2):
        now, before = (_token_logprobs(module, recorder.by_version[v], batches[step]) for v in (step, step - 1))
        expected = (now - before).abs()[batches[step]["loss_mask"]].mean().item()
        assert logger.keys_at(step)["fidelity/version_drift_absmean"] == pytest.approx(expected, abs=1e-6)
        # on-policy tokens of version `step` (gap 0), sampled (mu) by the initial weights: |log pi_old - log mu|
        mask = batches[step]["loss_mask"]
        discrepancy = (now - batches[step]["behavior_logprobs"]).abs()[mask].mean().item()
        logged = logger.keys_at(step)["fidelity/discrepancy_absmean/gap_0"]
        assert logged == pytest.approx(discrepancy, abs=1e-6) and logged > 0  # the weights moved since they sampled
    assert "fidelity/version_drift_absmean" not in logger.keys_at(0)  # no version before the first
