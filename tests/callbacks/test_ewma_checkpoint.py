"""EWMAReference state across checkpoints: crash-then-resume, old checkpoints, several instances."""

import pytest
import torch
from asyncrl_callbacks import EWMAReference
from ewma_models import SGDModel, loader, tiny_trainer
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint

# Lightning's advice for resuming mid-epoch does not apply: SGDModel draws its batches from the step.
pytestmark = [
    pytest.mark.filterwarnings("ignore:.*dataloader is not resumable"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
]

STEPS = 8  # one epoch; the checkpoint is taken after step 4
# Low values at steps 2, 3, 4 reset the average at step 4 only if the streak survives the checkpoint after step 3;
# the gap of 5 at step 2 must survive it too for W to be 5 (not 3) afterwards.
VALUES = [0.9, 0.9, 0.1, 0.1, 0.1, 0.9, 0.1, 0.1]
GAPS = [1, 2, 5, 1, 1, 3, 0, 1]


def make_ewmas() -> list[EWMAReference]:
    """Two instances on the same module: their state must not mix (distinct state keys)."""
    return [
        EWMAReference(staleness_window="auto", module_attr="policy", tau=0.5, patience=3),
        EWMAReference(beta=0.9, module_attr="policy", patience=None, log_prefix="reference_slow/"),
    ]


class Crash(Callback):
    """Simulates a crash after step 6."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 6:
            raise RuntimeError("simulated crash")


def fit(root, ewmas, callbacks=(), ckpt_path=None, **kwargs):
    model = SGDModel(values=VALUES, gaps=GAPS, ewmas=ewmas)
    trainer = tiny_trainer(root, STEPS, [*ewmas, *callbacks], **kwargs)
    trainer.fit(model, loader(n=32, batch_size=2), ckpt_path=ckpt_path)
    return model


def test_crash_then_resume_matches_uninterrupted_run(tmp_path):
    straight = make_ewmas()
    straight_model = fit(tmp_path / "straight", straight)

    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_train_steps=4)
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(tmp_path / "crashed", make_ewmas(), [checkpoints, Crash()], enable_checkpointing=True)
    (ckpt,) = (tmp_path / "ckpt").glob("*.ckpt")
    assert "step=4" in ckpt.name

    resumed = make_ewmas()
    resumed_model = fit(tmp_path / "resumed", resumed, ckpt_path=ckpt)

    assert straight[0].num_resets == resumed[0].num_resets == 1
    assert straight[0].staleness_window == resumed[0].staleness_window == 5
    for p, q in zip(straight_model.parameters(), resumed_model.parameters()):
        assert torch.equal(p, q)
    for a, b in zip(straight, resumed):
        assert a.low_streak == b.low_streak
        assert a._total_weight == b._total_weight
        for name, tensor in a.averaged_parameters.items():
            assert torch.equal(tensor, b.averaged_parameters[name]), name
    assert not torch.equal(straight[0].averaged_parameters["weight"], straight[1].averaged_parameters["weight"])


class AverageAtStart(Callback):
    """Records whether the average equals the live weights when training starts."""

    def __init__(self, ewma):
        self.ewma, self.at_live = ewma, None

    def on_train_start(self, trainer, pl_module):
        live = dict(pl_module.policy.named_parameters())
        self.at_live = all(torch.equal(t, live[n]) for n, t in self.ewma.averaged_parameters.items())


def test_old_checkpoint_without_average_loads_with_warning(tmp_path):
    trainer = tiny_trainer(tmp_path, 2, [], enable_checkpointing=False)
    model = SGDModel()
    trainer.fit(model, loader())
    trainer.save_checkpoint(tmp_path / "plain.ckpt")

    ewma = EWMAReference(beta=0.5, module_attr="policy", patience=None)
    probe = AverageAtStart(ewma)
    with pytest.warns(UserWarning, match="no EWMA average"):
        tiny_trainer(tmp_path, 4, [ewma, probe]).fit(SGDModel(), loader(), ckpt_path=tmp_path / "plain.ckpt")
    assert probe.at_live  # the average started at the loaded weights, not at the fresh model's
    assert ewma._total_weight == pytest.approx(1 + 0.5 + 0.25)  # start (Z = 1) plus the steps 3 and 4


def test_state_keys_differ_between_instances():
    keys = {ewma.state_key for ewma in make_ewmas()}
    keys.add(EWMAReference(beta=0.9, module_attr="value_head").state_key)
    assert len(keys) == 3
