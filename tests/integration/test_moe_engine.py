"""The real engine with the tiny mixture-of-experts policy (`model=tiny_moe`): one turn spans a weight
update pushed by the staged route (the one an MoE takes on CPU: `weights/choice.py`), and every token's
mu equals the trainer's log-prob at its own version."""

import asyncio
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.models.lora import LoRASettings, engine_weights
from lit_asyncrl.models.moe_routing import recorded_routing, routing_disagreement
from lit_asyncrl.scoring import token_logprobs
from tests.support.small_engines import started_engine

# One xdist worker runs this module's tests: they share module-scoped engines.
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("test_moe_engine")]


@pytest.fixture(scope="module")
def moe_engine():
    """An fp32 engine serving the tiny MoE policy, its versions pushed by the staged route."""
    engine = started_engine(resolve_model_path("tiny_moe"), weight_transfer="staged")
    yield engine
    engine.shutdown()


def trainer_logprobs(model, prompt, turn, temperature):
    ids = torch.tensor([prompt + turn.token_ids])
    with torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids), temperature)[0, len(prompt) :]


def routing(model, prompt, turn):
    with torch.no_grad(), recorded_routing(model) as chosen:
        model(torch.tensor([prompt + turn.token_ids]))
    return [layer.clone() for layer in chosen]


def test_a_turn_across_an_update_matches_each_tokens_own_version(moe_engine):
    path = resolve_model_path("tiny_moe")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    old_version = moe_engine.version
    # What a run pushes: the experts one tensor each, as vLLM's loader reads a checkpoint.
    moe_engine.push_weights(engine_weights(model, LoRASettings()), version=old_version)
    prompt, temperature = [1], 0.8
    streamed, enough_old_tokens = [0], threading.Event()

    def on_tokens(ids, logprobs):
        streamed[0] += len(ids)
        if streamed[0] >= 20:
            enough_old_tokens.set()

    pending = asyncio.run_coroutine_threadsafe(
        moe_engine.generate(prompt, max_tokens=200, temperature=temperature, ignore_eos=True, on_tokens=on_tokens),
        moe_engine.loop,
    )
    assert enough_old_tokens.wait(60)
    new_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in new_model.parameters():  # the experts and the routers move too
            parameter.add_(torch.randn_like(parameter) * 0.05)
    moe_engine.push_weights(engine_weights(new_model, LoRASettings()), version=old_version + 1)
    turn = pending.result(timeout=120)

    versions = torch.tensor(turn.versions)
    cut = int((versions == old_version).sum())
    assert 0 < cut < len(versions)
    assert versions[:cut].eq(old_version).all() and versions[cut:].eq(old_version + 1).all()
    mu = torch.tensor(turn.logprobs)
    old_pi = trainer_logprobs(model, prompt, turn, temperature)
    new_pi = trainer_logprobs(new_model, prompt, turn, temperature)
    assert (old_pi[:cut] - mu[:cut]).abs().max() < 1e-4
    assert (new_pi[cut:] - mu[cut:]).abs().max() < 1e-4
    # Not the other version's: the update changed the tokens' log-probs and the routing of some of them.
    assert (old_pi[cut:] - mu[cut:]).abs().max() > 1e-2
    assert (new_pi[:cut] - mu[:cut]).abs().max() > 1e-2
    assert routing_disagreement(routing(model, prompt, turn), routing(new_model, prompt, turn)) > 0
