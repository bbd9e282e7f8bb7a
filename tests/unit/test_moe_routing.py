"""Routing of the tiny MoE policy: read from a forward, replayed in another (the trainer half of R3)."""

from __future__ import annotations

import copy

import pytest
import torch

from lit_asyncrl.models import build_tiny_moe
from lit_asyncrl.models.moe_routing import (
    BatchRouting,
    applied,
    decoder_layer_index,
    follow_batch_routing,
    recorded_routing,
    replayed_routing,
    routing_disagreement,
    topk_routers,
)

TOKENS = torch.tensor([[1, 5, 9, 14, 20, 33, 41, 2, 7, 11, 60, 71]])


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    folder = build_tiny_moe(cache_dir=tmp_path_factory.mktemp("cache"))
    return AutoModelForCausalLM.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def perturbed(policy):
    """The policy with its routers moved (a stand-in for another forward's numerics): other top-2s."""
    other = copy.deepcopy(policy)
    torch.manual_seed(3)
    with torch.no_grad():
        for router in topk_routers(other):
            router.weight.add_(0.05 * torch.randn_like(router.weight))
    return other


def routing_of(model) -> list[torch.Tensor]:
    with torch.no_grad(), recorded_routing(model) as routing:
        model(TOKENS)
    return [choice.clone() for choice in routing]


def test_the_recorded_routing_is_each_routers_top_2_of_its_softmax(policy):
    inputs = []
    handle = topk_routers(policy)[1].register_forward_hook(lambda module, args, output: inputs.append(args[0]))
    try:
        routing = routing_of(policy)
    finally:
        handle.remove()
    assert len(routing) == 2 and routing[0].shape == routing[1].shape == (12, 2)
    expected = torch.softmax(inputs[0] @ topk_routers(policy)[1].weight.T, dim=-1).topk(2, dim=-1).indices
    assert torch.equal(routing[1], expected)


def test_the_disagreement_counts_tokens_whose_set_of_experts_differs():
    first = [torch.tensor([[0, 1], [2, 3]]), torch.tensor([[4, 5], [6, 7]])]
    second = [torch.tensor([[1, 0], [2, 4]]), torch.tensor([[4, 5], [7, 6]])]
    # Layer 0: token 0 the same set in another order, token 1 differs; layer 1: both the same.
    assert routing_disagreement(first, second) == 0.25
    assert routing_disagreement(first, first) == 0.0


def test_replaying_another_forwards_routing_computes_each_token_with_those_experts(policy, perturbed):
    own, given = routing_of(policy), routing_of(perturbed)
    assert 0 < routing_disagreement(own, given) < 1  # the perturbation flipped some choices, not all
    block = policy.model.layers[0].mlp
    captured = {}
    hooks = [
        block.register_forward_hook(lambda module, args, output: captured.update(hidden=args[0], output=output)),
    ]
    try:
        with torch.no_grad(), replayed_routing(policy, given), recorded_routing(policy) as replayed:
            policy(TOKENS)
    finally:
        for hook in hooks:
            hook.remove()
    # The experts used are the given ones, on every token of every layer.
    assert all(torch.equal(used, choice) for used, choice in zip(replayed, given))
    # Layer 0's output by hand: the given experts' SwiGLU outputs, weighted by this policy's router
    # probabilities of them renormalised to sum to 1.
    hidden = captured["hidden"].reshape(-1, 128)
    probabilities = torch.softmax(hidden @ block.gate.weight.T, dim=-1)
    expected = torch.zeros_like(hidden)
    for token in range(hidden.shape[0]):
        weights = probabilities[token, given[0][token]]
        weights = weights / weights.sum()
        for weight, expert in zip(weights, given[0][token]):
            gate, up = (block.experts.gate_up_proj[expert] @ hidden[token]).chunk(2)
            expected[token] += weight * (block.experts.down_proj[expert] @ (torch.nn.functional.silu(gate) * up))
    assert torch.allclose(captured["output"].reshape(-1, 128), expected, atol=1e-6)


def test_replaying_the_policys_own_routing_changes_nothing(policy):
    with torch.no_grad():
        plain = policy(TOKENS).logits
        with replayed_routing(policy, routing_of(policy)):
            replayed = policy(TOKENS).logits
    assert torch.equal(plain, replayed)


def test_a_token_given_no_choice_keeps_its_routers_own(policy, perturbed):
    own, given = routing_of(policy), routing_of(perturbed)
    partial = [choice.clone() for choice in given]
    for choice in partial:
        choice[:5] = -1  # the first five tokens: no recorded choice
    with torch.no_grad(), replayed_routing(policy, partial), recorded_routing(policy) as used:
        policy(TOKENS)
    for layer, choice in enumerate(used):
        assert torch.equal(choice[:5], own[layer][:5]) and torch.equal(choice[5:], given[layer][5:])


def test_the_router_is_trained_through_the_replayed_experts(policy, perturbed):
    trained = copy.deepcopy(policy).train()
    with replayed_routing(trained, routing_of(perturbed)):
        trained(TOKENS).logits.logsumexp(-1).sum().backward()
    assert all(
        router.weight.grad is not None and router.weight.grad.abs().sum() > 0 for router in topk_routers(trained)
    )


def test_a_routing_that_does_not_fit_the_model_is_refused(policy):
    routing = routing_of(policy)
    too_few = pytest.raises(ValueError, match="1 routings given for a model with 2 routers")
    with too_few, replayed_routing(policy, routing[:1]):
        pass
    other_tokens = pytest.raises(ValueError, match=r"a routing of shape \(12, 2\) for a forward of 6 tokens")
    with other_tokens, torch.no_grad(), replayed_routing(policy, routing):
        policy(TOKENS[:, :6])


def as_batch_routing(routing: list[torch.Tensor], rows: int = 1) -> torch.Tensor:
    """Per-layer routings [tokens, top_k] as a batch's [B, T, layers, top_k]."""
    return torch.stack(routing, dim=1).reshape(rows, -1, len(routing), routing[0].shape[-1]).to(torch.int16)


def one_version(experts: torch.Tensor, replay: bool) -> BatchRouting:
    """A batch routing [B, T, layers, top_k] all computed under version 0 (-1: none), as `collate` gives it."""
    computed = (experts >= 0).flatten(start_dim=2).any(dim=2)
    return BatchRouting(experts[:, :, None], torch.where(computed, 0, -1)[:, :, None], replay)


@pytest.fixture(scope="module")
def following(policy):
    """The policy with routers that follow the batch routing `applied` sets."""
    model = copy.deepcopy(policy)
    follow_batch_routing(model)
    return model


def test_under_a_replayed_batch_routing_the_routers_take_it_and_count_where_their_own_differed(following, perturbed):
    own, given = routing_of(following), routing_of(perturbed)
    routing = one_version(as_batch_routing(given), replay=True)
    with torch.no_grad():
        with replayed_routing(following, given):
            expected = following(TOKENS).logits
        with applied(routing), recorded_routing(following) as used:
            replayed = following(TOKENS).logits
    assert all(torch.equal(choice, wanted) for choice, wanted in zip(used, given))
    assert torch.equal(replayed, expected)  # the same forward as the explicit replay
    # Flips: (token, layer) pairs whose own top-2 set differs from the given one (hand-counted by
    # routing_disagreement, tested above), over the 12 tokens x 2 layers.
    assert routing.compared == 24
    assert routing.flipped == round(routing_disagreement(own, given) * 24) > 0
    assert routing.flipped_share == routing.flipped / 24


def test_measured_only_a_batch_routing_changes_no_logit_and_positions_without_a_choice_are_not_compared(
    following, perturbed
):
    own, given = routing_of(following), routing_of(perturbed)
    experts = as_batch_routing(given)
    experts[0, :4] = -1  # no recorded choice for the first four positions
    routing = one_version(experts, replay=False)
    with torch.no_grad():
        plain = following(TOKENS).logits  # outside `applied`: untouched
        with applied(routing):
            measured = following(TOKENS).logits
    assert torch.equal(measured, plain)
    assert routing.compared == 8 * 2
    tail_own = [choice[4:] for choice in own]
    tail_given = [choice[4:] for choice in given]
    assert routing.flipped == round(routing_disagreement(tail_own, tail_given) * 16)


def test_a_forward_over_some_rows_follows_those_rows_routing(following, perturbed):
    given = routing_of(perturbed)
    two_rows = torch.cat([as_batch_routing(routing_of(following)), as_batch_routing(given)])  # [2, 12, 2, 2]
    second_row = one_version(two_rows, replay=True).rows(torch.tensor([1]))
    with torch.no_grad(), applied(second_row), recorded_routing(following) as used:
        following(TOKENS)
    assert all(torch.equal(choice, wanted) for choice, wanted in zip(used, given))


def test_a_forward_follows_one_versions_routing_or_each_positions_newest():
    none = [-1, -1]
    # One row, three positions, one layer, top-2; slot 0 computed under version 4, slot 1 under version 5.
    recorded = torch.tensor([[[[[0, 1]], [[6, 7]]], [[[2, 3]], [none]], [[none], [[4, 5]]]]], dtype=torch.int16)
    versions = torch.tensor([[[4, 5], [4, -1], [-1, 5]]])
    newest = BatchRouting(recorded, versions, replay=True)
    assert newest.experts.tolist() == [[[[6, 7]], [[2, 3]], [[4, 5]]]]
    assert newest.rows(slice(None), version=4).experts.tolist() == [[[[0, 1]], [[2, 3]], [none]]]
    # Position 1 was not computed under version 5: version 4's routing of it stands (a push that changed no
    # tensor computes nothing again).
    assert newest.rows(torch.tensor([0]), version=5).experts.tolist() == [[[[6, 7]], [[2, 3]], [[4, 5]]]]
    assert newest.rows(slice(None), version=3).experts.tolist() == [[[none], [none], [none]]]
    assert newest.rows(slice(None), version=6).experts.tolist() == newest.experts.tolist()
    assert newest.experts.dtype == torch.int16


def test_a_routers_layer_is_read_from_its_name_as_the_engine_numbers_layers():
    assert decoder_layer_index("model.layers.3.mlp.gate") == 3
    assert decoder_layer_index("base_model.model.model.layers.11.mlp.gate") == 11
    with pytest.raises(ValueError, match="which decoder layer 'gate' belongs to"):
        decoder_layer_index("gate")


def test_a_policy_that_follows_batch_routing_can_still_be_pickled(following):
    import pickle

    copied = pickle.loads(pickle.dumps(following))
    with torch.no_grad():
        assert torch.equal(copied(TOKENS).logits, following(TOKENS).logits)
