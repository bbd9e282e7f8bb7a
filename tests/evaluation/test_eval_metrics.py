"""avg@k and pass@k: hand-computed values, the unbiased estimator, summed states."""

import pytest
import torch

from lit_asyncrl.eval_metrics import AvgAtK, PassAtK, pass_at_k


def test_pass_at_k_matches_the_combinatorial_formula_by_hand():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    # n=4, c=0: 0;  n=4, c=3, k=2: only 1 failure < k draws -> 1
    successes = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 1]], dtype=torch.float32)
    assert pass_at_k(successes, k=2).tolist() == pytest.approx([0.5, 0.0, 1.0], abs=1e-12)
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10 = 0.9
    assert pass_at_k(torch.tensor([[0.0, 1, 0, 1, 0]]), k=3).item() == pytest.approx(0.9, abs=1e-12)


def test_pass_at_k_is_not_the_biased_estimate():
    # n=4, c=1, k=2: the biased 1 - (1 - 1/4)^2 = 0.4375, the unbiased 0.5
    assert pass_at_k(torch.tensor([[1.0, 0, 0, 0]]), k=2).item() != pytest.approx(0.4375)


def test_pass_at_one_is_the_success_rate_and_pass_at_n_is_any_success():
    successes = torch.tensor([[1.0, 0, 1, 0, 0], [0, 0, 0, 0, 0]])
    assert pass_at_k(successes, k=1).tolist() == pytest.approx([0.4, 0.0])
    assert pass_at_k(successes, k=5).tolist() == pytest.approx([1.0, 0.0])


def test_k_larger_than_n_is_refused():
    with pytest.raises(ValueError, match="k=5, n=4"):
        pass_at_k(torch.zeros(2, 4), k=5)


def test_metrics_average_over_instances_across_updates():
    avg, passk = AvgAtK(), PassAtK(k=2)
    first = torch.tensor([[1.0, 0, 0, 0]])  # avg 0.25, pass@2 0.5
    second = torch.tensor([[1.0, 1, 1, 1], [0, 0, 0, 0]])  # avg 1, 0; pass@2 1, 0
    for chunk in (first, second):
        avg.update(chunk)
        passk.update(chunk)
    assert avg.compute().item() == pytest.approx((0.25 + 1 + 0) / 3)
    assert passk.compute().item() == pytest.approx((0.5 + 1 + 0) / 3)


def test_states_are_sums_so_distributed_reduction_is_exact():
    # Two "ranks" with different instance counts: the merged state equals one metric over all rows.
    rank0, rank1, single = PassAtK(k=2), PassAtK(k=2), PassAtK(k=2)
    rows0, rows1 = torch.tensor([[1.0, 0, 0, 0]]), torch.tensor([[1.0, 1, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0]])
    rank0.update(rows0)
    rank1.update(rows1)
    single.update(torch.cat([rows0, rows1]))
    merged = (rank0.total + rank1.total) / (rank0.instances + rank1.instances)
    assert merged.item() == pytest.approx(single.compute().item())
    assert single.compute().item() == pytest.approx((0.5 + 1 + 0 + 0.5) / 4)
