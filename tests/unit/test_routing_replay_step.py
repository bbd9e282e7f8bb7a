"""A training step of an MoE policy on a batch that carries the engine's routing (`model.routing_replay`)."""

from __future__ import annotations

import copy

import pytest
import torch

from lit_asyncrl.before_fit import check_routing_replay
from lit_asyncrl.losses import DecoupledPPO, PPOClip
from lit_asyncrl.models import build_tiny_moe
from lit_asyncrl.models.moe_routing import recorded_routing, replayed_routing, routing_disagreement, topk_routers
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.reference import SnapshotReference
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
    return engine_routing_of(module.policy, batch, seed=3)


def engine_routing_of(policy: torch.nn.Module, batch: dict, seed: int) -> list[torch.Tensor]:
    other = copy.deepcopy(policy)
    torch.manual_seed(seed)
    with torch.no_grad():
        for router in topk_routers(other):
            router.weight.add_(0.05 * torch.randn_like(router.weight))
    return routing_in(other, batch)


def as_recorded(routing: list[torch.Tensor]) -> torch.Tensor:
    """Per-layer routings [tokens, top_k] over the batch's 4 x 6 positions as one version's slot [4, 6, 1, 2, 2]."""
    return torch.stack(routing, dim=1).reshape(4, 6, 1, 2, 2).to(torch.int16)


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
    # As `collate` gives it: every position's routing under version 0, one slot.
    batch["routed_experts"] = as_recorded(given)
    batch["routed_experts_versions"] = torch.zeros(4, 6, 1, dtype=torch.long)
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


class EngineBatches(torch.utils.data.Dataset):
    """Batch 0 all of version 0; batch 1 made when the step asks for it (the weights are then version 1), its
    tokens of versions 0 and 1 side by side in rows. Under each version the engine computed every position
    with its own routing (routers moved by a seed per version: an engine's numerics), and sampled that
    version's tokens from it: mu is each version's weights under that version's routing."""

    VERSIONS = {0: [0, 0, 1], 1: [1, 1], 2: [0], 3: [0, 1]}

    def __init__(self, module: AsyncRLModule) -> None:
        self.module = module
        self.weights = {0: copy.deepcopy(module.policy)}
        self.routings: dict[int, list[torch.Tensor]] = {}

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> dict:
        self.weights[index] = copy.deepcopy(self.module.policy)
        versions_by_row = all_version(0) if index == 0 else self.VERSIONS
        batch = make_batch(versions_by_row, success=[1.0, 0.0, 1.0, 1.0])
        mu = torch.zeros(4, 6)
        for version in range(index + 1):
            self.routings[version] = engine_routing_of(self.weights[version], batch, seed=10 + version)
            with torch.no_grad(), replayed_routing(self.weights[version], self.routings[version]):
                scored = token_logprobs(
                    self.weights[version], batch["input_ids"], batch["attention_mask"], TEMPERATURE, TOP_K
                )
            mu = torch.where(batch["versions"] == version, scored, mu)
        batch = make_batch(versions_by_row, success=[1.0, 0.0, 1.0, 1.0], behavior=mu)
        batch["routed_experts"] = torch.cat([as_recorded(self.routings[v]) for v in range(index + 1)], dim=2)
        batch["routed_experts_versions"] = torch.arange(index + 1).expand(4, 6, -1).clone()
        return batch


def test_each_snapshot_scores_its_versions_tokens_under_the_routing_the_engine_used_then(moe_folder):
    torch.manual_seed(0)
    module = AsyncRLModule(
        model_path=str(moe_folder), loss=DecoupledPPO(), reference=SnapshotReference(), lr=1e-2, routing_replay=True
    )
    batches = EngineBatches(module)
    recorder = StepMetrics()
    make_trainer(2, [recorder]).fit(module, datamodule=ListDataModule(batches, FakeRollouts()))
    # Step 1 scores version 0's tokens under version 0's snapshot and routing: pi_old is mu itself (fp32).
    assert recorder.per_step[1]["train/ref_behavior_logratio_absmax"] < 1e-6
    # What one routing for both versions (each position's newest) would have given those tokens instead.
    old_weights = batches.weights[0]
    batch = batches[1]
    with torch.no_grad(), replayed_routing(old_weights, batches.routings[1]):
        newest = token_logprobs(old_weights, batch["input_ids"], batch["attention_mask"], TEMPERATURE, TOP_K)
    old_tokens = batch["versions"] == 0
    assert (newest - batch["behavior_logprobs"])[old_tokens].abs().max() > 1e-4


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
