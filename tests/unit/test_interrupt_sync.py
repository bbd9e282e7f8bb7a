"""InterruptSync with a recording rollout source over a real Lightning fit.

The policy is a lookup table: logits[b, t] = W[input_ids[b, t]] * attention_mask[b, t], with W a
[5, 3] matrix set by hand; the loss is W.sum(), so each SGD step (lr 0.5) subtracts 0.5 from every
entry. Before step 0 the scorer must see W0, before step 1 W0 - 0.5.
"""

from __future__ import annotations

import types

import lightning as L
import pytest
import torch
from asyncrl_callbacks import InterruptibleRollouts, InterruptSync
from torch import nn
from torch.utils.data import DataLoader

from tests.support.lightning import StepMetrics, make_trainer

pytestmark = pytest.mark.filterwarnings(
    "ignore:.*does not have many workers.*",
    "ignore:.*GPU available but not used.*",
    "ignore:.*LeafSpec.*",
)

W0 = torch.arange(15, dtype=torch.float32).reshape(5, 3)  # W0[i] = [3i, 3i + 1, 3i + 2]
IDS = torch.tensor([[1, 4, 0], [2, 2, 3]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])


class TableLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(W0.clone())

    def forward(self, input_ids, attention_mask):
        return types.SimpleNamespace(logits=self.table[input_ids] * attention_mask[..., None])


class TableModule(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.policy = TableLM()

    def training_step(self, batch, batch_idx):
        return self.policy.table.sum() * batch

    def configure_optimizers(self):
        return torch.optim.SGD(self.policy.parameters(), lr=0.5)


class FakeRollouts:
    """Records pause / score_unscored / resume; scores IDS with the given score_fn."""

    def __init__(self, scored: list[int], fail: bool = False) -> None:
        self.calls: list[tuple] = []
        self.scored, self.fail = list(scored), fail
        self.logits: list[torch.Tensor] = []

    def pause(self) -> None:
        self.calls.append(("pause",))

    def score_unscored(self, score_fn, version):
        self.calls.append(("score_unscored", version))
        if self.fail:
            raise RuntimeError("scoring exploded")
        self.logits.append(score_fn(IDS, MASK))
        return self.scored.pop(0)

    def resume(self) -> None:
        self.calls.append(("resume",))


def data(steps: int) -> DataLoader:
    return DataLoader([torch.tensor(1.0)] * steps, batch_size=None)


def expected_logits(table: torch.Tensor) -> torch.Tensor:
    # by hand: rows of the table for the ids, zeroed where the mask is 0
    return torch.stack(
        [
            torch.stack([table[1], table[4], torch.zeros(3)]),
            torch.stack([table[2], table[2], table[3]]),
        ]
    )


def test_pause_score_resume_each_step_with_the_pre_step_weights():
    rollouts = FakeRollouts(scored=[7, 11])
    metrics = StepMetrics()
    trainer = make_trainer(2, [InterruptSync(rollouts=rollouts, module_attr="policy"), metrics])
    module = TableModule()
    trainer.fit(module, train_dataloaders=data(2))

    assert isinstance(rollouts, InterruptibleRollouts)
    assert rollouts.calls == [
        ("pause",), ("score_unscored", 0), ("resume",),
        ("pause",), ("score_unscored", 1), ("resume",),
    ]  # fmt: skip
    step0, step1 = rollouts.logits
    # scored before each optimizer step: W0, then W0 - 0.5 (one SGD step on loss = sum(W))
    assert torch.equal(step0, expected_logits(W0))
    assert torch.equal(step1, expected_logits(W0 - 0.5))
    assert step0[0, 0].tolist() == [3.0, 4.0, 5.0] and step0[0, 2].tolist() == [0.0, 0.0, 0.0]
    # the scorer runs without autograd
    assert not step0.requires_grad and not step1.requires_grad
    # the same as a direct forward of the policy with those weights
    with torch.no_grad():
        direct = TableLM()(IDS, MASK).logits
    assert torch.equal(step0, direct)
    # two more steps' worth of weights after the fit: W0 - 2 * 0.5
    assert torch.equal(module.policy.table.detach(), W0 - 1.0)
    assert module.training  # train mode is restored after scoring
    assert [step["interrupt_sync/scored_tokens"] for step in metrics.per_step] == [7.0, 11.0]
    assert all(step["interrupt_sync/stall_s"] >= 0.0 for step in metrics.per_step)


def test_scoring_error_resumes_generation_before_propagating():
    rollouts = FakeRollouts(scored=[], fail=True)
    trainer = make_trainer(2, [InterruptSync(rollouts=rollouts, module_attr="policy")])
    module = TableModule()
    with pytest.raises(RuntimeError, match="scoring exploded"):
        trainer.fit(module, train_dataloaders=data(2))

    assert rollouts.calls == [("pause",), ("score_unscored", 0), ("resume",)]
    pauses = sum(call == ("pause",) for call in rollouts.calls)
    resumes = sum(call == ("resume",) for call in rollouts.calls)
    assert pauses == resumes == 1
    # the step never happened: the weights are untouched
    assert torch.equal(module.policy.table.detach(), W0)


def test_rollouts_without_pause_are_refused():
    class NotInterruptible:
        def pause(self) -> None: ...

    trainer = make_trainer(1, [InterruptSync(rollouts=NotInterruptible(), module_attr="policy")])
    with pytest.raises(TypeError, match="InterruptSync needs pause/score_unscored/resume"):
        trainer.fit(TableModule(), train_dataloaders=data(1))
