"""`trainer.strategy=fsdp2`: what the name selects, and the routes refused under it (no process starts)."""

import lightning as L
import pytest

from lit_asyncrl.fsdp import FSDP2Strategy, check_reference_supported
from lit_asyncrl.reference import build_reference


def test_the_name_selects_fsdp2_over_every_process_with_one_checkpoint_file():
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="fsdp2", logger=False, enable_checkpointing=False)
    strategy = trainer.strategy
    assert isinstance(strategy, FSDP2Strategy)
    assert strategy._tensor_parallel_size == 1  # no tensor parallelism: every process one shard
    assert strategy._save_distributed_checkpoint is False


@pytest.mark.parametrize("name", ["snapshot", "ewma", "interrupt_sync"])
def test_routes_not_yet_shard_aware_are_refused_under_fsdp2_naming_the_keys(name):
    with pytest.raises(ValueError, match=rf"reference={name} under trainer\.strategy=fsdp2: not supported yet"):
        check_reference_supported(FSDP2Strategy(), build_reference(name), fidelity=False)


def test_fidelity_is_refused_under_fsdp2_and_everything_passes_elsewhere():
    with pytest.raises(ValueError, match=r"fidelity=true under trainer\.strategy=fsdp2"):
        check_reference_supported(FSDP2Strategy(), build_reference("none"), fidelity=True)
    for name in ("none", "async_recompute", "dedicated"):
        check_reference_supported(FSDP2Strategy(), build_reference(name), fidelity=False)
    check_reference_supported(L.pytorch.strategies.DDPStrategy(), build_reference("snapshot"), fidelity=True)
