"""EngineWeightSync over a real 3-step fit: versions, the weights it publishes, its timing metrics.

The policy is one scalar weight w (nn.Linear(1, 1, bias=False)) with loss = w, so every SGD step
with lr 0.5 subtracts exactly 0.5: w = 1.0, 0.5, 0.0, -0.5 after 0, 1, 2, 3 steps (exact in binary).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from lit_asyncrl.rollout.weights.route import WeightPush
from lit_asyncrl.trainer_callbacks import EngineWeightSync
from tests.support.lightning import StepMetrics, make_trainer

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*does not have many workers.*",
    "ignore:.*GPU available but not used.*",
    "ignore:.*LeafSpec.*",
)


class FakeRollouts:
    """Records start/publish with a copy of the weights as they were at the call."""

    max_version_gap = 3
    weight_sync_every = 1
    groups_per_batch = 2

    def __init__(self, pushed: WeightPush | None = None) -> None:
        self.pushed = pushed
        self.starts: list[tuple[int, dict[str, torch.Tensor]]] = []
        self.publishes: list[tuple[int, dict[str, torch.Tensor]]] = []

    def configure(self, world_size, rank):
        return self

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state) -> None:
        pass

    def start(self, weights, version, train=True):
        self.starts.append((version, {name: tensor.detach().clone() for name, tensor in weights.items()}))

    def publish_weights(self, weights, version):
        self.publishes.append((version, {name: tensor.detach().clone() for name, tensor in weights.items()}))
        return self.pushed


class ScalarPolicyModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.policy = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.policy.weight.fill_(1.0)

    def training_step(self, batch, batch_idx):
        return self.policy.weight.sum() * batch  # d loss / d w = batch = 1.0

    def configure_optimizers(self):
        return torch.optim.SGD(self.policy.parameters(), lr=0.5)


class AfterStepWeights(L.Callback):
    """Copies w at the end of each training batch (after the optimizer step)."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.values.append(pl_module.policy.weight.item())


def fit(rollouts: FakeRollouts, steps: int = 3) -> tuple[L.Trainer, AfterStepWeights, StepMetrics]:
    after, metrics = AfterStepWeights(), StepMetrics()
    # The sync callback comes first, so the recorders run after it has logged.
    trainer = make_trainer(steps, [EngineWeightSync(rollouts=rollouts), after, metrics])
    data = DataLoader([torch.tensor(1.0)] * steps, batch_size=None)
    trainer.fit(ScalarPolicyModule(), train_dataloaders=data)
    return trainer, after, metrics


def test_start_once_then_one_publish_per_step_with_the_stepped_weights():
    rollouts = FakeRollouts()
    trainer, after, _ = fit(rollouts)

    assert trainer.global_step == 3
    assert [version for version, _ in rollouts.starts] == [0]
    assert rollouts.starts[0][1]["weight"].item() == 1.0  # the untrained weights
    assert list(rollouts.starts[0][1]) == ["weight"]  # the policy's state dict, not the LightningModule's
    assert [version for version, _ in rollouts.publishes] == [1, 2, 3]
    published = [weights["weight"].item() for _, weights in rollouts.publishes]
    assert published == [0.5, 0.0, -0.5]
    assert published == after.values  # what the policy held right after each step


def test_no_timings_no_push_metrics():
    _, _, metrics = fit(FakeRollouts(pushed=None))
    for step in metrics.per_step:
        assert "rollout/weight_push_s" not in step
        assert "rollout/engine_pause_s" not in step
        assert "rollout/weight_push_bytes" not in step


def test_timings_are_logged_summed():
    _, _, metrics = fit(FakeRollouts(pushed=WeightPush(write_s=0.25, pause_s=0.5, bytes=4096)))
    assert len(metrics.per_step) == 3
    for step in metrics.per_step:
        assert step["rollout/weight_push_s"] == 0.75  # write 0.25 + pause 0.5
        assert step["rollout/engine_pause_s"] == 0.5
        assert step["rollout/weight_push_bytes"] == 4096.0


def test_datamodule_without_rollouts_is_refused_by_name():
    trainer = L.Trainer(
        max_steps=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[EngineWeightSync()],
    )

    class NoRollouts(L.LightningDataModule):
        def train_dataloader(self):
            return DataLoader([torch.tensor(1.0)], batch_size=None)

    with pytest.raises(TypeError, match="EngineWeightSync needs a rollout service"):
        trainer.fit(ScalarPolicyModule(), datamodule=NoRollouts())
