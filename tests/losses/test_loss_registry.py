"""Registry: every name builds from keyword arguments only; errors name what to change."""

import inspect
import math

import pytest

from lit_asyncrl.losses import LossStrategy, available_losses, get_loss, loss_class
from tests.support.losses import assert_close, assert_mask, inputs_from_ratios

REQUIRED_NAMES = {
    "ppo_clip", "ppo_clip_train_infer", "decoupled_ppo", "linear_prox", "linear_prox_train_infer",
    "loglinear_prox", "loglinear_prox_train_infer", "dual_clip", "tis_token", "tis_sequence", "icepop",
    "mis_sequence", "mis_geometric", "cispo", "gspo", "gppo", "m2po",
}  # fmt: skip


def test_required_names_are_registered():
    assert REQUIRED_NAMES <= set(available_losses())


# A config as YAML / the CLI spells it (lists, ints), with every value different from the default so
# that an argument the constructor drops is caught; STORED is what it must become (hand-written).
CONFIG = {
    "clip_bounds": [0.9, 1.1],
    "discrepancy_bounds": [0.7, 1.4],
    "discrepancy_cap": 1.4,
    "discrepancy_floor": 0.7,
    "alpha": 0.5,
    "weight_cap": 3,
    "dual_clip_bound": 4,
    "second_moment_bound": 0.09,
    "aggregation": "fixed",
    "normalizer": 8,
}
STORED = {
    "clip_bounds": (0.9, 1.1),
    "discrepancy_bounds": (0.7, 1.4),
    "discrepancy_cap": 1.4,
    "discrepancy_floor": 0.7,
    "alpha": 0.5,
    "weight_cap": 3.0,
    "dual_clip_bound": 4.0,
    "second_moment_bound": 0.09,
    "aggregation": "fixed",
    "normalizer": 8.0,
}


def config_for(name):
    return {key: CONFIG[key] for key in inspect.signature(loss_class(name)).parameters}


def names_taking(argument):
    return [name for name in available_losses() if argument in inspect.signature(loss_class(name)).parameters]


@pytest.mark.parametrize("name", available_losses())
def test_constructible_from_keyword_arguments_like_a_config(name):
    cls = loss_class(name)
    parameters = inspect.signature(cls).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters)
    assert {p.name for p in parameters} <= set(CONFIG), "new constructor argument: add it to CONFIG and STORED"
    assert all(CONFIG[p.name] != p.default for p in parameters)  # else a dropped argument goes unseen
    strategy = get_loss(name, **config_for(name))
    assert isinstance(strategy, LossStrategy) and strategy.name == name
    assert type(cls(**config_for(name))) is cls
    for key in config_for(name):
        value, expected = getattr(strategy, key), STORED[key]
        assert value == expected and type(value) is type(expected), (key, value)
        if isinstance(expected, tuple):  # a (low, high) pair of Python floats, not the YAML list
            assert all(type(bound) is float for bound in value), (key, value)


# Behaviour under CONFIG, on [4, 1] batches (one token per sequence, so GSPO's sequence ratio and the
# MIS / TIS sequence products are the token's own ratio). Advantages (+1, +1, -1, -1); pi_ref = mu_old,
# so r_d = 1 and r_s = r = pi_theta/mu_old for the strategies that read pi_ref. clip_bounds (0.9, 1.1):
# A >= 0 clipped iff r_s > 1.1, A < 0 clipped iff r_s < 0.9 (CISPO: r_s outside [0.9, 1.1]).
CLIP_ADVANTAGES = [[1.0], [1.0], [-1.0], [-1.0]]
CLIP_EXPECTED = [[True], [False], [True], [False]]  # just inside, just outside, just inside, just outside
PLAIN_CLIP_RATIOS = [[1.099], [1.101], [0.901], [0.899]]
# Interpolated with alpha = 0.5 (pi_prox from mu_old and pi_theta, the reference is ignored):
#   log-linear r_s = r^0.5:        1.2 -> 1.0954, 1.25 -> 1.1180, 0.83 -> 0.9110, 0.80 -> 0.8944
#   linear     r_s = 2r / (1 + r): 1.2 -> 1.0909, 1.25 -> 1.1111, 0.83 -> 0.9071, 0.80 -> 0.8889
# (and r_d = r^0.5 resp. 0.5 + 0.5 r stays inside the _train_infer mask [0.7, 1.4]).
INTERPOLATED_CLIP_RATIOS = [[1.2], [1.25], [0.83], [0.80]]


@pytest.mark.parametrize("name", names_taking("clip_bounds"))
def test_clip_bounds_from_a_config_decide_the_clip_mask(name):
    interpolated = "alpha" in inspect.signature(loss_class(name)).parameters
    ratios = INTERPOLATED_CLIP_RATIOS if interpolated else PLAIN_CLIP_RATIOS
    inputs = inputs_from_ratios(ratios, CLIP_ADVANTAGES, reference_ratio=[[1.0]] * 4)
    out = get_loss(name, **config_for(name))(inputs)
    assert_mask(out.clip_mask, CLIP_EXPECTED)  # the defaults (0.8, 1.2) would keep all four


# discrepancy_bounds (0.7, 1.4) (MIS: discrepancy_floor 0.7, discrepancy_cap 1.4), inclusive:
# r_d = 1.39 and 0.71 kept, 1.41 and 0.69 dropped.
# Strategies with pi_ref get those r_d directly (pi_theta = pi_ref, so r_s = 1); the interpolated
# _train_infer ones (alpha = 0.5) get r with r_d = r^0.5 (log-linear: 1.95 -> 1.3964, 1.97 -> 1.4036,
# 0.50 -> 0.7071, 0.48 -> 0.6928) or r_d = 0.5 + 0.5 r (linear: 1.79 -> 1.395, 1.81 -> 1.405,
# 0.41 -> 0.705, 0.39 -> 0.695).
DISCREPANCY_EXPECTED = [[True], [False], [True], [False]]
DISCREPANCY_POLICY_RATIOS = {
    "loglinear_prox_train_infer": [[1.95], [1.97], [0.50], [0.48]],
    "linear_prox_train_infer": [[1.79], [1.81], [0.41], [0.39]],
}
REFERENCE_DISCREPANCY_RATIOS = [[1.39], [1.41], [0.71], [0.69]]


@pytest.mark.parametrize("name", names_taking("discrepancy_bounds") + names_taking("discrepancy_cap"))
def test_discrepancy_bounds_from_a_config_decide_the_discrepancy_mask(name):
    if name in DISCREPANCY_POLICY_RATIOS:
        inputs = inputs_from_ratios(DISCREPANCY_POLICY_RATIOS[name], [[1.0]] * 4)
    else:
        reference = REFERENCE_DISCREPANCY_RATIOS
        inputs = inputs_from_ratios(reference, [[1.0]] * 4, reference_ratio=reference)
    out = get_loss(name, **config_for(name))(inputs)
    assert_mask(out.discrepancy_mask, DISCREPANCY_EXPECTED)  # the defaults would keep all four


def test_dual_clip_bound_from_a_config_decides_the_floor():
    # A < 0, r = 3.9 <= c = 4.0 passes gradient, r = 4.1 > c is floored (the default c = 3 floors both)
    out = get_loss("dual_clip", **config_for("dual_clip"))(inputs_from_ratios([3.9, 4.1], [-1.0, -1.0]))
    assert_mask(out.clip_mask, [True, False])


@pytest.mark.parametrize("name", ["tis_token", "tis_sequence"])
def test_weight_cap_from_a_config_truncates_the_weight(name):
    # pi_theta = pi_ref (r_s = 1, inside the clip), A = 1, rho = r_d = 2.5 and 5.0 (one token per
    # sequence): weights min(rho, 3) = 2.5 and 3.0, "fixed" sum / 8: loss = -(2.5 + 3.0) / 8 = -0.6875
    # (the default cap 2 with token_mean would give -2.0).
    ratios = [[2.5], [5.0]]
    out = get_loss(name, **config_for(name))(inputs_from_ratios(ratios, [[1.0], [1.0]], reference_ratio=ratios))
    assert_close(out.loss, -0.6875, tol=1e-12)


@pytest.mark.parametrize(("largest_log_ratio", "kept"), [(0.59, True), (0.61, False)])
def test_second_moment_bound_from_a_config_decides_the_m2po_mask(largest_log_ratio, kept):
    # log r = (0, 0, 0, x): mean (log r)^2 = x^2 / 4 = 0.087 (x = 0.59) <= tau = 0.09, every token kept;
    # 0.093 (x = 0.61) > 0.09, the largest is dropped (the default tau = 0.04 drops it in both cases).
    ratios = [[1.0], [1.0], [1.0], [math.exp(largest_log_ratio)]]
    out = get_loss("m2po", **config_for("m2po"))(inputs_from_ratios(ratios, [[1.0]] * 4))
    assert_mask(out.clip_mask, [[True], [True], [True], [kept]])


@pytest.mark.parametrize("name", available_losses())
def test_aggregation_and_normalizer_from_a_config_scale_the_loss(name):
    # pi_theta = pi_ref = mu_old and A = 1 on 2 x 2 tokens: every ratio and weight is 1, each token's
    # objective is 1, "fixed" with normalizer 8 gives loss = -4 / 8 = -0.5 (token_mean would give -1).
    ones = [[1.0, 1.0], [1.0, 1.0]]
    out = get_loss(name, **config_for(name))(inputs_from_ratios(ones, ones, reference_ratio=ones))
    assert_close(out.loss, -0.5, tol=1e-12)


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
