"""The real engine with the tiny mixture-of-experts policy (`model=tiny_moe`): one turn spans a weight
update pushed by the staged route (the one an MoE takes on CPU: `weights/choice.py`), and every token's
mu equals the trainer's log-prob at its own version."""

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


def test_a_turn_across_an_update_matches_each_tokens_own_version():
    path = resolve_model_path("tiny_moe")
    engine = started_engine(path, weight_transfer="staged")
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
