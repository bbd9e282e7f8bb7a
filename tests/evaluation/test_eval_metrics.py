"""avg@k, pass@k and pass^k: hand-computed values, the unbiased estimators, summed states."""

import pytest
import torch

from lit_asyncrl.eval_metrics import AvgAtK, HeldOutMetrics, PassAtK, pass_at_k, pass_hat_k


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


def test_held_out_metrics_of_a_mixture_are_kept_per_task_and_overall():
    metrics = HeldOutMetrics(2, ("desk", "guess"))
    # Chunk 1: two desk instances and one guess instance, 4 samples each.
    first = metrics.update(
        torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]),
        torch.tensor([1.0, 0.0, 1.0]),
        torch.tensor([0, 0, 1]),
    )
    assert {name: count for name, (_, count) in first.items()} == {
        "val/avg@2": 3, "val/pass@2": 3, "val/pass^2": 3, "val/greedy_success": 3,
        "val/desk/avg@2": 2, "val/desk/pass@2": 2, "val/desk/pass^2": 2, "val/desk/greedy_success": 2,
        "val/guess/avg@2": 1, "val/guess/pass@2": 1, "val/guess/pass^2": 1, "val/guess/greedy_success": 1,
    }  # fmt: skip
    # Chunk 2: one desk instance only; the game's metrics are not touched.
    second = metrics.update(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), torch.tensor([0.0]), torch.tensor([0]))
    assert not any("/guess/" in name for name in second)
    values = metrics.compute()
    # desk: avg@2 per instance 2/4, 0, 1/4 -> 0.25; pass@2 = 1 - C(n-c,2)/C(4,2): 1 - 1/6, 0, 1 - 3/6
    assert values["val/desk/avg@2"] == pytest.approx(0.25)
    assert values["val/desk/pass@2"] == pytest.approx((5 / 6 + 0 + 1 / 2) / 3)
    assert values["val/desk/greedy_success"] == pytest.approx(1 / 3)
    # pass^2 = C(c,2)/C(4,2): 1/6, 0, 0
    assert values["val/desk/pass^2"] == pytest.approx((1 / 6) / 3)
    assert (
        values["val/guess/avg@2"] == 1.0
        and values["val/guess/pass@2"] == 1.0
        and values["val/guess/greedy_success"] == 1.0
    )
    # overall: every instance once, (0.5 + 0 + 1 + 0.25) / 4; pass (5/6 + 0 + 1 + 1/2) / 4
    assert values["val/avg@2"] == pytest.approx(1.75 / 4)
    assert values["val/pass@2"] == pytest.approx((5 / 6 + 1 + 1 / 2) / 4)
    assert values["val/greedy_success"] == pytest.approx(2 / 4)


def test_held_out_metrics_of_a_single_task_have_only_the_overall_names():
    metrics = HeldOutMetrics(4)
    updated = metrics.update(torch.tensor([[1.0, 0.0, 0.0, 0.0]]), torch.tensor([1.0]))
    assert set(updated) == {"val/avg@4", "val/pass@4", "val/pass^4", "val/greedy_success"}
    assert metrics.compute() == {"val/avg@4": 0.25, "val/pass@4": 1.0, "val/pass^4": 0.0, "val/greedy_success": 1.0}


def test_pass_hat_k_is_every_sample_succeeding_by_hand():
    # tau-bench's pass^k: C(c, k) / C(n, k) per instance.
    successes = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    assert pass_hat_k(successes, 1).tolist() == [0.75, 1.0, 0.25]  # the success rate
    assert pass_hat_k(successes, 2).tolist() == pytest.approx([3 / 6, 1.0, 0.0])  # C(3,2)/C(4,2); C(1,2) = 0
    assert pass_hat_k(successes, 4).tolist() == [0.0, 1.0, 0.0]  # all four, only the second
    with pytest.raises(ValueError, match="pass\\^k needs 1 <= k <= n"):
        pass_hat_k(successes, 5)
