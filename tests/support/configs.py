"""The shipped Hydra configs composed as a run composes them (`${hydra:...}` resolvable), nothing started."""

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig

from lit_asyncrl.config_dir import config_dir

CONFIG_DIR = config_dir()


def compose_train(overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)  # lets ${hydra:...} resolve outside @hydra.main
        return cfg
