"""The module's reference-gap metric, by hand."""

import math

import torch

from lit_asyncrl.module import _reference_gap_metrics


def test_reference_gap_ignores_context_and_unscored_tokens():
    ref = torch.tensor([[0.0, -1.0, math.nan, -2.0]])
    mu = torch.tensor([[5.0, -1.5, -1.0, -1.75]])
    policy = torch.tensor([[False, True, True, True]])
    # policy tokens: |-1 + 1.5| = 0.5, NaN (unscored, left out), |-2 + 1.75| = 0.25
    assert _reference_gap_metrics(ref, mu, policy) == {
        "train/ref_behavior_logratio_absmax": 0.5,
        "train/ref_behavior_logratio_absmean": 0.375,
    }


def test_no_reference_or_nothing_scored_logs_nothing():
    mu = torch.zeros(1, 2)
    assert _reference_gap_metrics(None, mu, torch.ones(1, 2, dtype=torch.bool)) == {}
    assert _reference_gap_metrics(torch.full((1, 2), math.nan), mu, torch.ones(1, 2, dtype=torch.bool)) == {}
