"""Every strategy builds from a Hydra node and from a Lightning-CLI (jsonargparse) class_path."""

import inspect

import pytest

from lit_asyncrl.losses import LossStrategy, available_losses, loss_class


def config_for(name: str) -> dict:
    """The constructor defaults as a config would spell them (lists, not tuples)."""
    parameters = inspect.signature(loss_class(name)).parameters.values()
    return {p.name: list(p.default) if isinstance(p.default, tuple) else p.default for p in parameters}


@pytest.mark.parametrize("name", available_losses())
def test_hydra_instantiate_by_class_and_by_name(name):
    instantiate = pytest.importorskip("hydra.utils").instantiate
    omegaconf = pytest.importorskip("omegaconf")
    cls = loss_class(name)
    by_class = omegaconf.OmegaConf.create({"_target_": f"{cls.__module__}.{cls.__qualname__}", **config_for(name)})
    by_name = omegaconf.OmegaConf.create({"_target_": "lit_asyncrl.losses.get_loss", "name": name, **config_for(name)})
    for node in (by_class, by_name):
        strategy = instantiate(node)
        assert type(strategy) is cls
        if hasattr(strategy, "clip_bounds"):  # a ListConfig became a plain (low, high) tuple
            assert isinstance(strategy.clip_bounds, tuple)


@pytest.mark.parametrize("name", available_losses())
def test_lightning_cli_class_path(name):
    jsonargparse = pytest.importorskip("jsonargparse")
    cls = loss_class(name)
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--loss", type=LossStrategy)
    config = {"class_path": f"{cls.__module__}.{cls.__qualname__}", "init_args": config_for(name)}
    parsed = parser.parse_object({"loss": config})
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    strategy = instantiate(parsed).loss
    assert type(strategy) is cls
