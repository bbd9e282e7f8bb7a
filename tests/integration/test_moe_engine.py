"""The real engine with the tiny mixture-of-experts policy (`model=tiny_moe`): one turn spans a weight
update pushed by the staged route (the one an MoE takes on CPU: `weights/choice.py`), every token's
mu equals the trainer's log-prob at its own version, and the experts each version routed to are recorded."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.models.lora import LoRASettings, engine_weights
from lit_asyncrl.models.moe_routing import recorded_routing, routing_disagreement
from tests.support.small_engines import started_engine
from tests.support.version_turns import check_each_token_matches_its_version, moved_policy, turn_across_an_update

pytestmark = pytest.mark.engine


def routing(model, prompt, turn):
    with torch.no_grad(), recorded_routing(model) as chosen:
        model(torch.tensor([prompt + turn.token_ids]))
    return [layer.clone() for layer in chosen]


def test_a_turn_across_an_update_matches_each_tokens_own_version_and_records_each_versions_routing():
    path = resolve_model_path("tiny_moe")
    engine = started_engine(path, weight_transfer="staged", capture_routing=True)
    try:
        model, new_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), moved_policy(path)
        prompt, temperature = [1], 0.8
        # What a run pushes: the experts one tensor each, as vLLM's loader reads a checkpoint.
        old_weights, new_weights = (engine_weights(policy, LoRASettings()) for policy in (model, new_model))
        turn, cut = turn_across_an_update(engine, old_weights, new_weights, prompt, temperature)
    finally:
        engine.shutdown()
    check_each_token_matches_its_version(turn, cut, model, new_model, prompt, temperature)
    # The update moved the routers too: some tokens go to other experts under the new version.
    assert routing_disagreement(routing(model, prompt, turn), routing(new_model, prompt, turn)) > 0
    # The engine recorded each version's routing: version 0 of the positions before the push (the prompt and
    # the old tokens but the last), version 1 of every position again (the push computed them anew).
    assert turn.routed_experts.keys() == {0, 1}
    for version, policy, computed in (
        (0, model, len(prompt) + cut - 1),
        (1, new_model, len(prompt) + len(turn.token_ids) - 1),
    ):
        recorded = turn.routed_experts[version].long()
        assert recorded.shape == (computed, 2, 2) and (recorded >= 0).all()
        for layer, chosen in enumerate(routing(policy, prompt, turn)):
            assert torch.equal(recorded[:, layer].sort(dim=-1).values, chosen[:computed].sort(dim=-1).values)


def engine_turns(dtype: str, waves: list[list[list[int]]], tokens: int):
    """Turns of a fresh tiny-MoE engine that records its routing, one per prompt: each wave's prompts at once,
    the waves one after another (a later wave can take an earlier one's prompts from the prefix cache); and the
    fp32 trainer."""
    import asyncio

    from lit_asyncrl.rollout.engine.settings import EngineSettings
    from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
    from tests.support.runs import SMALL_KV_CACHE_GIB

    path = resolve_model_path("tiny_moe")
    settings = EngineSettings(dtype=dtype, max_model_len=256, kv_cache_gib=SMALL_KV_CACHE_GIB, capture_routing=True)
    engine = VLLMEngine(path, settings)
    engine.start()
    try:

        async def sample(prompts):
            return await asyncio.gather(
                *(engine.generate(prompt, max_tokens=tokens, temperature=1.0, ignore_eos=True) for prompt in prompts)
            )

        turns = [engine.run(sample(prompts), timeout_s=120) for prompts in waves]
    finally:
        engine.shutdown()
    return turns, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_the_engine_records_the_experts_each_position_went_to():
    # Two requests in one batch (the recorder splits the batch's rows); then one whose prompt begins with the
    # first one's first block (the CPU engine's 128 positions), which it takes from the prefix cache: those
    # positions get the routing their KV was computed with, in the other request.
    shared = [1] + [3 + (7 * index) % 60 for index in range(129)]
    waves = [[shared, [1, 40, 2]], [shared[:128] + [9, 11]]]
    turns, model = engine_turns("float32", waves, tokens=48)
    for prompt, turn in zip([*waves[0], *waves[1]], [*turns[0], *turns[1]]):
        assert turn.routed_experts.keys() == {0}  # no push: one version computed everything
        recorded = turn.routed_experts[0].long()
        # Every position the engine computed: the prompt and each sampled token but the last (never an input).
        assert recorded.shape == (len(prompt) + len(turn.token_ids) - 1, 2, 2) and (recorded >= 0).all()
        for layer, chosen in enumerate(routing(model, prompt, turn)):
            engine_sets = recorded[:, layer].sort(dim=-1).values
            assert torch.equal(engine_sets, chosen[: recorded.shape[0]].sort(dim=-1).values)


def test_replaying_a_bf16_engines_routing_brings_its_flipped_tokens_to_the_others_discrepancy():
    from lit_asyncrl.models.moe_routing import replayed_routing
    from tests.support.version_turns import trainer_logprobs

    prompts = [[1, 3 + index] for index in range(8)]
    [turns], model = engine_turns("bfloat16", [prompts], tokens=200)
    without, replayed, flipped = [], [], []
    for prompt, turn in zip(prompts, turns):
        recorded = turn.routed_experts[0].long()
        own = routing(model, prompt, turn)
        computed = recorded.shape[0]
        # The last position is never an input: the trainer's own routing stands in there.
        given = [torch.cat([recorded[:, layer], own[layer][computed:]]) for layer in range(len(own))]
        differs = torch.stack(
            [
                (recorded[:, layer].sort(-1).values != own[layer][:computed].sort(-1).values).any(-1)
                for layer in range(2)
            ]
        ).any(0)
        mu = torch.tensor(turn.logprobs)
        without.append((trainer_logprobs(model, prompt, turn, 1.0) - mu).abs())
        with replayed_routing(model, given):
            replayed.append((trainer_logprobs(model, prompt, turn, 1.0) - mu).abs())
        # A sampled token's logits come from the position before it.
        flipped.append(differs[len(prompt) - 1 : len(prompt) - 1 + len(turn.token_ids)])
    without, replayed, flipped = torch.cat(without), torch.cat(replayed), torch.cat(flipped)
    assert 0 < int(flipped.sum()) < len(flipped) // 10
    others = without[~flipped].mean()
    print(
        f"bf16 engine, {len(flipped)} tokens, {int(flipped.sum())} at flipped positions: without replay "
        f"{without[flipped].mean():.2e} against the others' {others:.2e}; replayed {replayed[flipped].mean():.2e}"
    )
    assert without[flipped].mean() > 2 * others  # the flips are where the MoE's discrepancy comes from
    assert replayed[flipped].mean() < 2 * others  # under the engine's routing they come down to the others'
