"""A training step of an MoE policy on a batch that carries the engine's routing (`model.routing_replay`)."""

from __future__ import annotations

import copy

import pytest
import torch

from lit_asyncrl.before_fit import check_routing_replay
from lit_asyncrl.losses import PPOClip
from lit_asyncrl.models import build_tiny_moe
from lit_asyncrl.models.moe_routing import recorded_routing, replayed_routing, routing_disagreement, topk_routers
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.reference.attached import InterruptSyncReference
from lit_asyncrl.scoring import token_logprobs
from tests.support.batches import TEMPERATURE, TOP_K, all_version, make_batch
from tests.support.fakes import FakeRollouts
from tests.support.lightning import ListDataModule, StepMetrics, make_trainer


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    return build_tiny_moe(cache_dir=tmp_path_factory.mktemp("cache"))


def engine_routing(module: AsyncRLModule, batch: dict) -> list[torch.Tensor]:
    """A routing another forward chose (the module's routers moved): what a bf16 engine stands for here."""
    other = copy.deepcopy(module.policy)
    torch.manual_seed(3)
    with torch.no_grad():
        for router in topk_routers(other):
            router.weight.add_(0.05 * torch.randn_like(router.weight))
    return routing_in(other, batch)


def routing_in(policy: torch.nn.Module, batch: dict) -> list[torch.Tensor]:
    with torch.no_grad(), recorded_routing(policy) as routing:
        policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return [choice.clone() for choice in routing]


def one_step(moe_folder, replay: bool) -> tuple[dict[str, float], float]:
    """One PPO-clip step on a batch whose mu is the module's log-probs under the engine's routing; the
    step's metrics and the routing's hand-counted disagreement with the module's own."""
    torch.manual_seed(0)
    module = AsyncRLModule(model_path=str(moe_folder), loss=PPOClip(), lr=1e-3, routing_replay=replay)
    batch = make_batch(all_version(0), success=[1.0, 0.0, 1.0, 1.0])
    given = engine_routing(module, batch)
    with torch.no_grad(), replayed_routing(module.policy, given):
        mu = token_logprobs(module.policy, batch["input_ids"], batch["attention_mask"], TEMPERATURE, TOP_K)
    batch = make_batch(all_version(0), success=[1.0, 0.0, 1.0, 1.0], behavior=mu)
    batch["routed_experts"] = torch.stack(given, dim=1).reshape(4, 6, 2, 2).to(torch.int16)
    flipped = routing_disagreement(routing_in(module.policy, batch), given)
    recorder = StepMetrics()
    make_trainer(1, [recorder]).fit(module, datamodule=ListDataModule([batch], FakeRollouts()))
    (metrics,) = recorder.per_step
    return metrics, flipped


def test_replayed_the_step_scores_each_token_under_the_engines_experts(moe_folder):
    metrics, flipped = one_step(moe_folder, replay=True)
    # pi_theta under the engine's routing is mu itself: ratio 1 on every token, so the loss is
    # -(token mean of A) = -(3 + 2 - 1 - 2) / 8 = -0.25, as for any on-policy batch.
    assert metrics["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["train/loss"] == pytest.approx(-0.25, abs=1e-6)
    # Where the module's own routers would have chosen otherwise, over all 24 positions x 2 layers.
    assert 0 < flipped < 1
    assert metrics["train/routing_flipped"] == pytest.approx(flipped)


def test_not_replayed_the_step_keeps_its_own_experts_and_still_counts_the_flips(moe_folder):
    metrics, flipped = one_step(moe_folder, replay=False)
    # Its own routing scores some tokens otherwise than the engine did: the ratio moves off 1.
    assert abs(metrics["train/ratio_mean"] - 1.0) > 1e-4
    assert metrics["train/routing_flipped"] == pytest.approx(flipped)


def test_routing_replay_is_refused_without_what_it_needs_naming_the_key(moe_folder):
    dense = AsyncRLModule(routing_replay=True)
    with pytest.raises(ValueError, match="model.routing_replay=true .* has no expert routers"):
        check_routing_replay(dense, capture_routing=True)
    moe = AsyncRLModule(model_path=str(moe_folder), routing_replay=True)
    with pytest.raises(ValueError, match="set rollout.capture_routing=true"):
        check_routing_replay(moe, capture_routing=False)
    check_routing_replay(moe, capture_routing=True)  # snapshot-free PPO-clip: accepted
    interrupted = AsyncRLModule(model_path=str(moe_folder), reference=InterruptSyncReference(), routing_replay=True)
    with pytest.raises(ValueError, match="reference=interrupt_sync: it scores pi_old while turns are still in flight"):
        check_routing_replay(interrupted, capture_routing=True)
