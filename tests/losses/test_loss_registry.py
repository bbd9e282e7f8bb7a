"""Registry: every name builds from keyword arguments only; errors name what to change."""

import inspect

import pytest

from lit_asyncrl.losses import LossStrategy, available_losses, get_loss, loss_class

REQUIRED_NAMES = {
    "ppo_clip", "ppo_clip_train_infer", "decoupled_ppo", "linear_prox", "linear_prox_train_infer",
    "loglinear_prox", "loglinear_prox_train_infer", "dual_clip", "tis_token", "tis_sequence", "icepop",
    "mis_sequence", "mis_geometric", "cispo", "gspo", "gppo", "m2po",
}  # fmt: skip


def test_required_names_are_registered():
    assert REQUIRED_NAMES <= set(available_losses())


@pytest.mark.parametrize("name", available_losses())
def test_constructible_from_keyword_arguments_like_a_config(name):
    cls = loss_class(name)
    parameters = inspect.signature(cls).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters)
    # Hydra / the CLI pass lists, not tuples.
    config = {p.name: list(p.default) if isinstance(p.default, tuple) else p.default for p in parameters}
    strategy = get_loss(name, **config)
    assert isinstance(strategy, LossStrategy) and strategy.name == name
    assert type(cls(**config)) is cls
    assert name in repr(strategy) or cls.__name__ in repr(strategy)


def test_unknown_name_lists_available():
    with pytest.raises(ValueError, match="available: .*ppo_clip"):
        get_loss("ppo_clipp")


def test_unknown_argument_is_named():
    with pytest.raises(ValueError, match="clip_bound"):
        get_loss("ppo_clip", clip_bound=(0.8, 1.2))


@pytest.mark.parametrize(
    ("name", "kwargs", "argument"),
    [
        ("ppo_clip", {"clip_bounds": (1.2, 0.8)}, "clip_bounds"),  # low > high
        ("ppo_clip", {"clip_bounds": (0.0, 1.2)}, "clip_bounds"),  # low <= 0
        ("ppo_clip", {"clip_bounds": (0.2,)}, "clip_bounds"),  # not a pair
        ("ppo_clip", {"clip_bounds": (1.1, 1.2)}, "clip_bounds"),  # 1 outside
        ("decoupled_ppo", {"discrepancy_bounds": (-1.0, 1.01)}, "discrepancy_bounds"),
        ("decoupled_ppo", {"discrepancy_bounds": (1.01, 0.99)}, "discrepancy_bounds"),
        ("dual_clip", {"dual_clip_bound": 0.5}, "dual_clip_bound"),
        ("tis_token", {"weight_cap": 0.0}, "weight_cap"),
        ("m2po", {"second_moment_bound": -1.0}, "second_moment_bound"),
        ("linear_prox", {"alpha": 1.5}, "alpha"),
        ("ppo_clip", {"aggregation": "mean"}, "aggregation"),
        ("ppo_clip", {"aggregation": "fixed"}, "normalizer"),
        ("ppo_clip", {"aggregation": "fixed", "normalizer": 0.0}, "normalizer"),
        ("ppo_clip", {"normalizer": 4.0}, "normalizer"),
    ],
)
def test_invalid_values_name_the_argument(name, kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        get_loss(name, **kwargs)


def test_positional_arguments_are_rejected():
    with pytest.raises(TypeError):
        loss_class("ppo_clip")((0.8, 1.2))
