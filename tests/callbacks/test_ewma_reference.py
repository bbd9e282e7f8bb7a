"""EWMAReference: the average, the decay, the reference forward, the reset and its metrics."""

import warnings

import pytest
import torch
from asyncrl_callbacks import EWMAReference
from ewma_models import MONITOR, ScriptedModel, loader, tiny_trainer
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.loggers import CSVLogger
from torch import nn

from lit_asyncrl.reference import EWMAReferenceSource

N_PARAMS = 4 * 3 + 3  # nn.Linear(4, 3)


def script(steps: int, seed: int = 0) -> torch.Tensor:
    """Weights theta_0..theta_steps as rows (float32, like the model's)."""
    return torch.randn(steps + 1, N_PARAMS, generator=torch.Generator().manual_seed(seed))


def flat(ewma: EWMAReference) -> torch.Tensor:
    return torch.cat([t.flatten() for t in ewma.averaged_parameters.values()])


def recursive_average(thetas: torch.Tensor, betas: list[float]) -> torch.Tensor:
    """sum_k (prod_{j>k} beta_j) theta_k / sum_k (prod_{j>k} beta_j), in float64; a beta of 0 is a reset."""
    total, weight = thetas[0].double(), 1.0
    for theta, beta in zip(thetas[1:].double(), betas):
        total, weight = beta * total + theta, beta * weight + 1.0
    return total / weight


class Recorder(Callback):
    """Runs after the EWMA callback: records its state and the logged metrics after every optimizer step."""

    def __init__(self, ewma: EWMAReference) -> None:
        self.ewma, self.rows = ewma, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if "reference/ewma_resets" not in trainer.callback_metrics:
            return  # no optimizer step yet
        live = torch.cat([p.detach().flatten() for p in pl_module.policy.parameters()])
        self.rows.append(
            dict(
                resets=int(trainer.callback_metrics["reference/ewma_resets"]),
                streak=int(trainer.callback_metrics["reference/low_mask_streak"]),
                at_live=torch.equal(flat(self.ewma), live),
            )
        )


def fit_scripted(tmp_path, ewma, steps, values=None, gaps=None, step_every=1, **trainer_kwargs):
    thetas = script(steps)
    model = ScriptedModel(thetas, values=values, gaps=gaps, ewma=ewma, step_every=step_every)
    recorder = Recorder(ewma)
    data = loader(n=2 * steps * step_every, batch_size=2)
    tiny_trainer(tmp_path, steps, [ewma, recorder], **trainer_kwargs).fit(model, data)
    return thetas, model, recorder.rows


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.75, 0.9])
def test_average_equals_closed_form(tmp_path, beta):
    steps = 12
    ewma = EWMAReference(beta=beta, module_attr="policy", patience=None)
    thetas, _, _ = fit_scripted(tmp_path, ewma, steps)
    weights = torch.tensor([beta ** (steps - k) for k in range(steps + 1)], dtype=torch.float64)
    expected = (weights[:, None] * thetas.double()).sum(0) / weights.sum()
    assert (flat(ewma).double() - expected).abs().max() <= 1e-6


def test_batches_without_optimizer_step_do_not_update(tmp_path):
    steps, beta = 6, 0.75
    ewma = EWMAReference(beta=beta, module_attr="policy", patience=None)
    thetas, _, _ = fit_scripted(tmp_path, ewma, steps, step_every=2)
    expected = recursive_average(thetas, [beta] * steps)
    assert (flat(ewma).double() - expected).abs().max() <= 1e-6


def test_whole_module_is_averaged_when_no_attribute_is_given(tmp_path):
    ewma = EWMAReference(beta=0.5, patience=None)
    thetas, _, _ = fit_scripted(tmp_path, ewma, 3)
    assert list(ewma.averaged_parameters) == ["policy.weight", "policy.bias"]
    assert (flat(ewma).double() - recursive_average(thetas, [0.5] * 3)).abs().max() <= 1e-6


@pytest.mark.parametrize(("window", "beta"), [(0, 0.0), (2, 0.5), (6, 0.75), (18, 0.9)])
def test_beta_from_staleness_window(window, beta):
    ewma = EWMAReference(staleness_window=window)
    assert ewma.staleness_window == window
    assert ewma.beta == pytest.approx(beta)
    # The centre of mass of the EWMA weights (1 - beta) beta^j sits at age beta / (1 - beta) = W / 2.
    assert ewma.beta / (1 - ewma.beta) == pytest.approx(window / 2)


def test_auto_window_is_running_max_of_observed_gaps(tmp_path):
    gaps = [[1, 0], [3, 1], [2], [6, 2, 0], [], [1]]
    ewma = EWMAReference(staleness_window="auto", module_attr="policy", patience=None)
    assert ewma.staleness_window == EWMAReference.default_window  # before any observation
    thetas, _, _ = fit_scripted(tmp_path, ewma, len(gaps), gaps=gaps)
    windows = [1, 3, 3, 6, 6, 6]  # the empty batch observes nothing and keeps W
    assert ewma.staleness_window == 6
    expected = recursive_average(thetas, [w / (w + 2) for w in windows])
    assert (flat(ewma).double() - expected).abs().max() <= 1e-6


def test_auto_window_warns_when_no_gap_was_observed(tmp_path):
    ewma = EWMAReference(module_attr="policy", patience=None)
    with pytest.warns(UserWarning, match="No version gaps observed"):
        fit_scripted(tmp_path, ewma, 2)
    assert ewma.beta == pytest.approx(0.5)


@pytest.mark.parametrize(
    "kwargs",
    [dict(beta=0.5, staleness_window=2), dict(beta=1.0), dict(beta=-0.1), dict(staleness_window=-1), dict(patience=0)],
)
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError):
        EWMAReference(**kwargs)


def test_reference_forward_uses_average_without_touching_live_weights(tmp_path):
    ewma = EWMAReference(beta=0.75, module_attr="policy", patience=None)
    thetas, model, _ = fit_scripted(tmp_path, ewma, 5)
    # Inside training_step the reference saw the average before that batch's step.
    for step, (x, out) in enumerate(model.reference_outputs):
        average = recursive_average(thetas[: step + 1], [0.75] * step).float()
        weight, bias = average[:12].view(3, 4), average[12:]
        torch.testing.assert_close(out, x @ weight.T + bias, rtol=0, atol=1e-6)
        assert not out.requires_grad
    live = [p.detach().clone() for p in model.policy.parameters()]
    x = torch.randn(2, 4, requires_grad=True)
    out = ewma.reference_forward(x)
    assert not out.requires_grad
    assert all(torch.equal(a, b) for a, b in zip(live, model.policy.parameters()))
    assert torch.equal(model.policy.weight.detach(), thetas[-1][:12].view(3, 4))


def test_reference_forward_before_fit_raises():
    with pytest.raises(RuntimeError, match="on_fit_start"):
        EWMAReference(beta=0.5).reference_forward(torch.zeros(1))


LOW, HIGH = 0.1, 0.9
VALUES = [HIGH, LOW, LOW, HIGH, LOW, LOW, LOW, LOW, LOW, LOW, HIGH, LOW]


def test_reset_at_patience_th_low_step(tmp_path):
    ewma = EWMAReference(beta=0.9, module_attr="policy", tau=0.5, patience=3)
    thetas, _, rows = fit_scripted(tmp_path, ewma, len(VALUES), values=VALUES)
    assert [r["streak"] for r in rows] == [0, 1, 2, 0, 1, 2, 3, 1, 2, 3, 0, 1]
    assert [r["resets"] for r in rows] == [0, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [r["at_live"] for r in rows] == [i in (6, 9) for i in range(len(VALUES))]
    assert ewma.num_resets == 2 and ewma.low_streak == 1
    betas = [0.0 if i in (6, 9) else 0.9 for i in range(len(VALUES))]  # a reset is an update with beta 0
    assert (flat(ewma).double() - recursive_average(thetas, betas)).abs().max() <= 1e-6


def test_disabled_reset_never_fires_but_counts_streak(tmp_path):
    ewma = EWMAReference(beta=0.9, module_attr="policy", tau=0.5, patience=None)
    thetas, _, rows = fit_scripted(tmp_path, ewma, len(VALUES), values=VALUES)
    assert [r["streak"] for r in rows] == [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 0, 1]
    assert ewma.num_resets == 0 and not any(r["resets"] or r["at_live"] for r in rows)
    assert (flat(ewma).double() - recursive_average(thetas, [0.9] * len(VALUES))).abs().max() <= 1e-6


def test_nan_metric_neither_extends_nor_breaks_streak(tmp_path):
    values = [LOW, LOW, float("nan"), LOW, float("nan"), HIGH]
    ewma = EWMAReference(beta=0.9, module_attr="policy", tau=0.5, patience=3)
    _, _, rows = fit_scripted(tmp_path, ewma, len(values), values=values)
    assert [r["streak"] for r in rows] == [1, 2, 2, 3, 0, 0]
    assert ewma.num_resets == 1


def test_missing_monitor_warns_and_never_resets(tmp_path):
    ewma = EWMAReference(beta=0.9, module_attr="policy", tau=0.5, patience=1)
    with pytest.warns(UserWarning, match="not in callback_metrics"):
        fit_scripted(tmp_path, ewma, 3)
    assert ewma.num_resets == 0


class ThresholdReset(EWMAReference):
    """Overrides the predicate: reset at once on any value below 0.05, ignoring the streak."""

    def should_reset(self, trainer, pl_module, value):
        return value < 0.05


def test_should_reset_override(tmp_path):
    values = [0.5, 0.01, 0.5, 0.5, 0.02]
    ewma = ThresholdReset(beta=0.9, module_attr="policy", tau=0.8)
    _, _, rows = fit_scripted(tmp_path, ewma, len(values), values=values)
    assert [r["resets"] for r in rows] == [0, 1, 1, 1, 2]
    assert [r["at_live"] for r in rows] == [False, True, False, False, True]


def test_reset_metrics_are_logged(tmp_path):
    ewma = EWMAReference(beta=0.9, module_attr="policy", tau=0.5, patience=3)
    _, model, _ = fit_scripted(tmp_path, ewma, 4, values=[LOW] * 4, logger=CSVLogger(tmp_path), log_every_n_steps=1)
    trainer = model.trainer
    assert trainer.logged_metrics["reference/ewma_resets"] == 1
    assert trainer.logged_metrics["reference/low_mask_streak"] == 1
    assert trainer.callback_metrics["reference/ewma_beta"] == pytest.approx(0.9)
    header = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert {"reference/ewma_resets", "reference/low_mask_streak", MONITOR} <= set(header.split(","))


def test_attach_and_update_without_trainer():
    module = torch.nn.Linear(4, 3)
    frozen = torch.nn.Linear(4, 3).requires_grad_(False)
    ewma = EWMAReference(beta=0.5)
    ewma.attach(torch.nn.ModuleDict(dict(live=module, frozen=frozen)))
    assert list(ewma.averaged_parameters) == ["live.weight", "live.bias"]  # frozen weights are not copied
    start = module.weight.detach().clone()
    with torch.no_grad():
        module.weight.add_(1.0)
    ewma.update()
    torch.testing.assert_close(ewma.averaged_parameters["live.weight"], start + 2 / 3, rtol=0, atol=1e-6)


def zero_beta_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "beta=0" in str(w.message)]


def test_zero_staleness_window_warns_once_that_the_reference_is_the_live_policy(tmp_path):
    # Synchronous rollouts: every observed gap is 0, so W = 0, beta = W / (W + 2) = 0 and every update
    # re-centres the average on the live weights (pi_ref = pi_theta). Warned once, not at every step.
    ewma = EWMAReference(staleness_window="auto", module_attr="policy", patience=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        thetas, _, rows = fit_scripted(tmp_path, ewma, 4, gaps=[[0, 0], [0], [0, 0], [0]])
    assert len(zero_beta_warnings(caught)) == 1
    assert ewma.staleness_window == 0 and ewma.beta == 0.0
    assert all(row["at_live"] for row in rows)  # theta_prox = theta after every step
    assert torch.equal(flat(ewma), thetas[-1])


@pytest.mark.parametrize(
    ("kwargs", "gaps"),
    [
        (dict(staleness_window="auto"), [[1, 0], [3], [0]]),  # W = 1 from the first update: beta 1/3
        (dict(staleness_window="auto"), None),  # nothing observed: W = default_window, beta 0.5
        (dict(beta=0.0), None),  # an explicit beta = 0 is the user's choice, not a silent fallback
    ],
)
def test_no_zero_beta_warning_otherwise(tmp_path, kwargs, gaps):
    ewma = EWMAReference(module_attr="policy", patience=None, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_scripted(tmp_path, ewma, 3, gaps=gaps)
    assert zero_beta_warnings(caught) == []


class WarmStartPhase(LightningModule):
    """A supervised phase on the policy object, fitted by its own Trainer before the RL fit
    (as `lit_asyncrl.warm_start.WarmStart.run` does)."""

    def __init__(self, policy: nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.policy(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.policy.parameters(), lr=0.5)


class RLModule(LightningModule):
    """Trains the same policy object; the reference forward runs before each step."""

    def __init__(self, policy: nn.Module, ewma: EWMAReference) -> None:
        super().__init__()
        self.policy, self.ewma = policy, ewma
        self.reference_outputs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.ewma.observe_version_gaps(torch.tensor([2]))
        self.reference_outputs.append((x, self.ewma.reference_forward(x)))
        return nn.functional.mse_loss(self.policy(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.policy.parameters(), lr=0.1)


class AverageAtBatchStart(Callback):
    """Runs after the EWMA callback: copies the average at the start of every batch, before the step."""

    def __init__(self, ewma: EWMAReference) -> None:
        self.ewma, self.averages, self.live = ewma, [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.averages.append((trainer.global_step, {k: v.clone() for k, v in self.ewma.averaged_parameters.items()}))
        self.live.append({k: v.detach().clone() for k, v in pl_module.policy.named_parameters()})


def test_average_at_the_first_rl_step_equals_the_warmed_up_weights(tmp_path):
    torch.manual_seed(0)
    policy = nn.Linear(4, 3)
    constructed = {k: v.detach().clone() for k, v in policy.named_parameters()}
    tiny_trainer(tmp_path, 3, []).fit(WarmStartPhase(policy), loader())  # the warm start moves the weights
    warmed = {k: v.detach().clone() for k, v in policy.named_parameters()}
    assert not any(torch.equal(warmed[k], constructed[k]) for k in warmed)

    (ewma,) = EWMAReferenceSource().callbacks()  # the library's EWMA reference (module_attr="policy")
    recorder = AverageAtBatchStart(ewma)
    model = RLModule(policy, ewma)
    tiny_trainer(tmp_path, 2, [ewma, recorder]).fit(model, loader())

    step, average = recorder.averages[0]
    assert step == 0
    assert average.keys() == warmed.keys()
    assert all(torch.equal(average[k], warmed[k]) for k in warmed)  # exactly, not approximately
    x, reference = model.reference_outputs[0]
    assert torch.equal(reference, nn.functional.linear(x, warmed["weight"], warmed["bias"]))
    # the first update folds theta_1 in: (beta theta_warm + theta_1) / (beta + 1), beta = W / (W + 2) = 0.5
    step, after_first = recorder.averages[1]
    theta_1 = recorder.live[1]
    assert step == 1
    for k in warmed:
        torch.testing.assert_close(after_first[k], (0.5 * warmed[k] + theta_1[k]) / 1.5, rtol=0, atol=1e-6)
