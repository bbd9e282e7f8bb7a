"""Every shipped Hydra config composes and instantiates (module, datamodule, trainer) without an engine."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate

from lit_asyncrl.losses import available_losses
from lit_asyncrl.reference import available_references
from lit_asyncrl.train import CONFIG_DIR

EXPERIMENTS = sorted(path.stem for path in (Path(CONFIG_DIR) / "experiment").glob("*.yaml"))
LOSSES = sorted(path.stem for path in (Path(CONFIG_DIR) / "loss").glob("*.yaml"))


def compose_train(overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # lets ${hydra:...} resolve outside @hydra.main
        return cfg


def test_every_registered_loss_has_a_config():
    assert LOSSES == sorted(available_losses())


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_instantiates(experiment, tmp_path):
    # runtime.output_dir only exists inside @hydra.main; point the logger at tmp_path instead.
    cfg = compose_train([f"experiment={experiment}", f"trainer.default_root_dir={tmp_path}", f"trainer.logger.save_dir={tmp_path}"])
    module = instantiate(cfg.module, _convert_="all")
    datamodule = instantiate(cfg.data, _convert_="all")
    trainer = instantiate(cfg.trainer, _convert_="all")
    assert module.hparams.loss == cfg.loss.name and module.hparams.reference == cfg.reference.name
    assert datamodule.engine is None  # nothing started
    assert trainer.max_steps == cfg.trainer.max_steps


@pytest.mark.parametrize("loss", LOSSES)
def test_loss_group_selects_the_strategy(loss, tmp_path):
    cfg = compose_train([f"loss={loss}", f"hydra.run.dir={tmp_path}"])
    module = instantiate(cfg.module, _convert_="all")
    assert type(module.loss_fn).__name__ and module.hparams.loss == loss


@pytest.mark.parametrize("reference", sorted(available_references()))
def test_reference_group_selects_the_source(reference, tmp_path):
    cfg = compose_train([f"reference={reference}", f"hydra.run.dir={tmp_path}"])
    module = instantiate(cfg.module, _convert_="all")
    assert module.hparams.reference == reference
    assert module.reference.exact == (reference in {"snapshot", "interrupt_sync", "dedicated"})


def test_snapshot_reference_holds_every_version_the_buffer_may_train_on(tmp_path):
    cfg = compose_train(["experiment=snapshot", "rollout.max_version_gap=2", f"hydra.run.dir={tmp_path}"])
    module = instantiate(cfg.module, _convert_="all")
    assert module.reference.retention.store.max_staleness == 2


def test_snapshot_budget_too_small_for_the_staleness_cap_fails_naming_the_key(tmp_path):
    cfg = compose_train(["experiment=snapshot", "rollout.max_version_gap=3", "reference.kwargs.max_resident=2", f"hydra.run.dir={tmp_path}"])
    with pytest.raises(Exception, match="max_resident"):
        instantiate(cfg.module, _convert_="all")


def test_sweeps_name_existing_experiments_and_keys(tmp_path):
    table1 = compose_train(["+sweep=table1", f"hydra.run.dir={tmp_path}"])
    assert set(table1.hydra.sweeper.params.experiment.split(",")) <= set(EXPERIMENTS)
    decay = compose_train(["experiment=ppo_ewma", "+sweep=ewma_decay", f"hydra.run.dir={tmp_path}"])
    assert decay.hydra.sweeper.params["reference.kwargs.beta"] == "0.9,0.75,0.5"
    assert "beta" in decay.reference.kwargs and "patience" in decay.reference.kwargs
