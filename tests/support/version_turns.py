"""One turn of a real engine that spans a weight update, and the trainer's log-probs of its tokens."""

import asyncio
import threading

import torch

from lit_asyncrl.scoring import token_logprobs


def turn_across_an_update(engine, old_weights, new_weights, prompt, temperature, old_tokens: int = 20):
    """Serve `old_weights`, start a turn, push `new_weights` once `old_tokens` tokens have streamed (an
    event, not a guessed delay), and return (the turn, how many of its tokens came from the old
    version) after checking that the versions switch once, each side non-empty."""
    old_version = engine.version
    engine.push_weights(old_weights, version=old_version)
    streamed, enough_old_tokens = [0], threading.Event()

    def on_tokens(ids, logprobs):
        streamed[0] += len(ids)
        if streamed[0] >= old_tokens:
            enough_old_tokens.set()

    pending = asyncio.run_coroutine_threadsafe(
        engine.generate(prompt, max_tokens=200, temperature=temperature, ignore_eos=True, on_tokens=on_tokens),
        engine.loop,
    )
    assert enough_old_tokens.wait(60)
    engine.push_weights(new_weights, version=old_version + 1)
    turn = pending.result(timeout=120)
    versions = torch.tensor(turn.versions)
    cut = int((versions == old_version).sum())
    assert 0 < cut < len(versions)
    assert versions[:cut].eq(old_version).all() and versions[cut:].eq(old_version + 1).all()
    return turn, cut


def trainer_logprobs(model, prompt, turn, temperature):
    """The trainer's log-prob of each of the turn's tokens after `prompt`."""
    ids = torch.tensor([prompt + turn.token_ids])
    with torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids), temperature)[0, len(prompt) :]


def moved_policy(model_path, seed: int = 1, scale: float = 0.05):
    """The model at `model_path` with every parameter moved by Gaussian noise: another version."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * scale)
    return model


def check_each_token_matches_its_version(turn, cut, old_model, new_model, prompt, temperature) -> None:
    """mu of the turn's first `cut` tokens equals `old_model`'s log-probs, of the rest `new_model`'s,
    within 1e-4 (an fp32 engine), and not the other model's, so a tag one token off would fail."""
    mu = torch.tensor(turn.logprobs)
    old_pi = trainer_logprobs(old_model, prompt, turn, temperature)
    new_pi = trainer_logprobs(new_model, prompt, turn, temperature)
    assert (old_pi[:cut] - mu[:cut]).abs().max() < 1e-4
    assert (new_pi[cut:] - mu[cut:]).abs().max() < 1e-4
    assert (old_pi[cut:] - mu[cut:]).abs().max() > 1e-2
    assert (new_pi[:cut] - mu[:cut]).abs().max() > 1e-2
