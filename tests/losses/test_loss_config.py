"""Every strategy builds from a Hydra node and from a Lightning-CLI (jsonargparse) class_path."""

import inspect

import pytest

from lit_asyncrl.losses import LossStrategy, available_losses, loss_class

#: A value other than every strategy's default for each argument, as a config spells it (lists,
#: not tuples): a front end that dropped or mangled an argument would leave the default in place.
NON_DEFAULT = {
    "clip_bounds": [0.7, 1.4],
    "discrepancy_bounds": [0.25, 8.0],
    "aggregation": "fixed",
    "normalizer": 64.0,
    "alpha": 0.5,
    "dual_clip_bound": 5.0,
    "second_moment_bound": 0.1,
    "discrepancy_cap": 3.0,
    "discrepancy_floor": 0.2,
    "weight_cap": 4.0,
}


def config_for(name: str) -> dict:
    """Every constructor argument of strategy `name`, set to its `NON_DEFAULT` value."""
    parameters = inspect.signature(loss_class(name)).parameters.values()
    config = {p.name: NON_DEFAULT[p.name] for p in parameters}
    assert all(config[p.name] != (list(p.default) if isinstance(p.default, tuple) else p.default) for p in parameters)
    return config


def assert_built_as_configured(strategy, name: str) -> None:
    assert type(strategy) is loss_class(name)
    for key, value in config_for(name).items():  # bounds become plain (low, high) tuples
        assert getattr(strategy, key) == (tuple(value) if isinstance(value, list) else value), key


@pytest.mark.parametrize("name", available_losses())
def test_hydra_instantiate_by_class_and_by_name(name):
    instantiate = pytest.importorskip("hydra.utils").instantiate
    omegaconf = pytest.importorskip("omegaconf")
    cls = loss_class(name)
    by_class = omegaconf.OmegaConf.create({"_target_": f"{cls.__module__}.{cls.__qualname__}", **config_for(name)})
    by_name = omegaconf.OmegaConf.create({"_target_": "lit_asyncrl.losses.get_loss", "name": name, **config_for(name)})
    for node in (by_class, by_name):
        assert_built_as_configured(instantiate(node), name)


@pytest.mark.parametrize("name", available_losses())
def test_lightning_cli_class_path(name):
    jsonargparse = pytest.importorskip("jsonargparse")
    cls = loss_class(name)
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--loss", type=LossStrategy)
    config = {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": config_for(name)}
    parsed = parser.parse_object({"loss": config})
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    assert_built_as_configured(instantiate(parsed).loss, name)
