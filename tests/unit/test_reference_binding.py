"""Reference sources get the rollout service through one contract, `ReferenceSource.bind`, which the
module calls once per fit from its `setup` (no glue callbacks)."""

from __future__ import annotations

import pytest
import torch

from lit_asyncrl.losses import DecoupledPPO
from lit_asyncrl.module import AsyncRLModule
from lit_asyncrl.reference import DedicatedReference, InterruptSyncReference, SnapshotReference
from tests.support.batches import all_version, make_batch, own_logprobs
from tests.support.fakes import FakeRollouts
from tests.support.lightning import ListDataModule, make_trainer


class NoWorkerRollouts(FakeRollouts):
    """A rollout service without the dedicated worker's switch."""

    use_dedicated_worker = None  # type: ignore[assignment]


def test_interrupt_sync_needs_a_service_that_pushes_every_step():
    reference = InterruptSyncReference()
    with pytest.raises(TypeError, match="^reference=interrupt_sync needs a rollout service"):
        reference.bind(None)
    every_second = FakeRollouts()
    every_second.weight_sync_every = 2
    with pytest.raises(ValueError, match=r"^reference=interrupt_sync needs rollout\.weight_sync_every=1, got 2$"):
        reference.bind(every_second)
    reference.bind(FakeRollouts())  # weight_sync_every=1: accepted


def test_the_dedicated_worker_is_asked_of_a_service_that_hosts_one_and_refused_otherwise():
    rollouts = FakeRollouts()
    DedicatedReference().bind(rollouts)
    assert rollouts.calls == [("use_dedicated_worker",)]
    with pytest.raises(TypeError, match="^reference=dedicated needs a rollout service that hosts an old-logit worker"):
        DedicatedReference().bind(NoWorkerRollouts())


def test_the_snapshot_reference_follows_the_services_cap_or_refuses_to_run_without_one():
    reference = SnapshotReference()
    with pytest.raises(TypeError, match="^reference=snapshot needs a rollout service"):
        reference.bind(None)
    rollouts = FakeRollouts()  # max_version_gap = 3
    reference.bind(rollouts)
    assert reference.retention.store.max_staleness == 3


@pytest.mark.parametrize("fidelity", [False, True])
def test_the_module_binds_its_reference_and_its_shadow_once_per_fit(fidelity):
    torch.manual_seed(0)
    module = AsyncRLModule(loss=DecoupledPPO(), reference=DedicatedReference(), lr=1e-3, fidelity=fidelity)
    batch = make_batch(all_version(0), success=[1.0, 0.0, 1.0, 1.0], behavior=own_logprobs(module))
    batch["old_logprobs"] = own_logprobs(module)  # what the dedicated worker would attach
    rollouts = FakeRollouts()
    make_trainer(1, []).fit(module, datamodule=ListDataModule([batch], rollouts))
    # Asked once, at set-up, before the service started.
    asked = [call[0] for call in rollouts.calls if call[0] in ("use_dedicated_worker", "start")]
    assert asked == ["use_dedicated_worker", "start"]
    if fidelity:  # the shadow follows the service's cap (3), not its fallback window (8)
        assert module.fidelity.exact.retention.store.max_staleness == 3


class KeepsPending(FakeRollouts):
    """A service whose checkpoints keep the pending episodes, with tokens of versions 2 to 4 live."""

    checkpoint_pending = True

    def live_versions(self):
        return [2, 3, 4]


def test_a_checkpoint_that_keeps_pending_episodes_keeps_the_snapshots_they_need_and_no_other():
    reference = SnapshotReference()
    reference.bind(FakeRollouts())  # a service that keeps none: no snapshot in checkpoints
    assert reference.retention.checkpoint_snapshots is False
    reference = SnapshotReference()
    reference.bind(KeepsPending())
    layer = torch.nn.Linear(2, 2)
    for version in (1, 2, 3, 4):
        reference.retention.save_version(version, module=layer)
    checkpoint = {}
    reference.retention.on_save_checkpoint(None, None, checkpoint)  # type: ignore[arg-type]
    (snapshots,) = checkpoint.values()
    # 2 and 3 (live); not 1 (no live token), not 4 (the newest: the checkpoint's own weights)
    assert sorted(snapshots) == [2, 3]


def test_tokens_of_a_version_without_a_snapshot_get_nan_and_a_warning(recwarn):
    reference = SnapshotReference()
    reference.bind(KeepsPending())
    reference.retention.save_version(3, module=torch.nn.Linear(2, 2))  # only the newest, 3, is resident
    versions = torch.tensor([[-1, 1, 3]])  # a prompt token, a token of version 1 (restored, no snapshot), one of 3
    batch = {
        "input_ids": torch.zeros(1, 3, dtype=torch.long),
        "attention_mask": torch.ones(1, 3),
        "temperature": 1.0,
        "top_k": -1,
    }
    batch["loss_mask"] = torch.tensor([[False, True, True]])
    current = torch.tensor([[0.0, -0.5, -0.25]])
    scores = reference.logprobs_under(batch, versions, current)
    assert scores[0, 0] == 0.0 and torch.isnan(scores[0, 1]) and scores[0, 2] == -0.25  # version 3 is the live weights
    assert any("versions [1] have no snapshot" in str(warning.message) for warning in recwarn)
