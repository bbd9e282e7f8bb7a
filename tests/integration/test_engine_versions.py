"""The real engine: per-token versions across an in-place weight update, and mu against the trainer."""

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.models import TinyPolicyConfig, build_tiny_policy, resolve_model_path
from lit_asyncrl.models.lora import LoRASettings, adapter_weights, merged_weights
from lit_asyncrl.rollout.engine.settings import EngineSettings, engine_core_environment, vllm_config
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
from tests.integration.engine_contract import check_engine_contract
from tests.support.lora import adapted
from tests.support.runs import SMALL_KV_CACHE_GIB
from tests.support.small_engines import started_engine
from tests.support.version_turns import (
    check_each_token_matches_its_version,
    moved_policy,
    trainer_logprobs,
    turn_across_an_update,
)

# One xdist worker runs this module's tests: they share module-scoped runs or engines.
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("test_engine_versions")]


@pytest.fixture(scope="module", params=[True, False], ids=["tied_head", "untied_head"])
def head_model_path(request):
    """The tiny policy with its output head tied to the embeddings, and with a head of its own."""
    path = build_tiny_policy(TinyPolicyConfig(tie_word_embeddings=request.param))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied == request.param
    return path


@pytest.fixture(scope="module", params=["file", "staged", "gloo"])
def weight_transfer(request):
    """The CPU routes of a weight push: a file the engine reloads, a file it prepares while it generates
    and swaps in (`staged_weights.py`), and vLLM's weight-transfer API over gloo."""
    return request.param


@pytest.fixture(scope="module")
def head_engine(head_model_path, weight_transfer):
    engine = started_engine(head_model_path, weight_transfer=weight_transfer)
    yield engine
    engine.shutdown()


def test_one_turn_spans_an_update_and_each_token_matches_its_own_version(head_engine, head_model_path):
    """The weight push, by either route, sends what vLLM's loader expects for a tied and an untied
    head: a head left stale would make the new version's tokens miss the trainer's log-probs."""
    model = AutoModelForCausalLM.from_pretrained(head_model_path, dtype=torch.float32)
    new_model = moved_policy(head_model_path)
    prompt, temperature = [1], 0.8
    turn, cut = turn_across_an_update(head_engine, model.state_dict(), new_model.state_dict(), prompt, temperature)
    check_each_token_matches_its_version(turn, cut, model, new_model, prompt, temperature)


def _descendants(pid: int) -> list[int]:
    from pathlib import Path

    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found, frontier = [], [pid]
    while frontier:
        kids = [child for child, parent in parents.items() if parent in frontier]
        found += kids
        frontier = kids
    return found


def test_the_engine_is_one_process_a_child_of_this_one(head_engine):
    # On CPU the model worker runs inside the engine-core process (no second spawned process),
    # forked from this one (the next test checks the config asks for it), so it starts without
    # importing everything again. Its one OpenMP thread, compile switch, temp dir and unnamed locks
    # are set after the fork (`tests/rollout/processes/test_engine_core_fork.py`).
    from pathlib import Path

    def cmdline(pid):
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    vllm_processes = [pid for pid in _descendants(os.getpid()) if cmdline(pid).startswith(b"VLLM::")]
    assert [cmdline(pid).split(b"\0")[0] for pid in vllm_processes] == [b"VLLM::EngineCore"]
    parent = int(Path(f"/proc/{vllm_processes[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert parent == os.getpid()


def test_the_engine_config_forks_the_engine_core_unless_vllms_start_method_says_spawn(head_engine, monkeypatch):
    def environment():
        made = vllm_config(head_engine.model_path, head_engine.settings, "cpu", seed=0, route_arguments={})
        return engine_core_environment(head_engine.settings, made)

    monkeypatch.delenv("VLLM_WORKER_MULTIPROC_METHOD", raising=False)
    forked = environment()
    # vLLM's CPU platform sets the variable to spawn as it makes a config: the caller's (none) stays.
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in os.environ
    assert {
        key: forked[key]
        for key in ("VLLM_WORKER_MULTIPROC_METHOD", "LIT_ASYNCRL_ENGINE_CORE_FORKED", "OMP_NUM_THREADS")
    } == {
        "VLLM_WORKER_MULTIPROC_METHOD": "fork",
        "LIT_ASYNCRL_ENGINE_CORE_FORKED": "quiet",
        "OMP_NUM_THREADS": "1",
    }
    # Its locks leave no file in /dev/shm (`engine_core_semaphores.py`, tested in a spawned process).
    assert forked["LIT_ASYNCRL_ENGINE_CORE_UNNAMED_LOCKS"] == "1"
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    spawned = environment()
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert spawned["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn" and "LIT_ASYNCRL_ENGINE_CORE_FORKED" not in spawned


def test_the_local_engine_keeps_the_engine_protocol(head_engine, head_model_path):
    # The same checks run against the Ray engine (`test_scale_out.py`): the producer, the episode
    # runner and the service rely on nothing else.
    weights = AutoModelForCausalLM.from_pretrained(head_model_path, dtype=torch.float32).state_dict()
    check_engine_contract(head_engine, weights)


def test_an_engine_with_adapters_as_versions_keeps_the_engine_protocol():
    # The adapter route: each version an adapter the engine holds beside the base weights. Its
    # first adapter is pushed before anything generates, as the rollout service does at its start.
    model_path = resolve_model_path(None)
    settings = EngineSettings(max_model_len=256, kv_cache_gib=SMALL_KV_CACHE_GIB, lora=LoRASettings(rank=8))
    adapter = adapter_weights(adapted(model_path))
    engine = VLLMEngine(model_path, settings)
    try:
        engine.start()
        engine.push_weights(adapter, version=0)
        check_engine_contract(engine, adapter, sent_again=True)
    finally:
        engine.shutdown()


def test_a_merged_adapter_push_serves_the_adapted_policy(head_engine, head_model_path):
    # `model.lora.push=merged`, for an engine without LoRA: the adapter folded into full weights
    # under the model's own names, by either route, for a tied and an untied head.
    policy = adapted(head_model_path, rank=8, seed=2)
    head_engine.push_weights(merged_weights(policy), version=head_engine.version + 1)
    turn = head_engine.run(head_engine.generate([1], max_tokens=40, temperature=0.8, ignore_eos=True), timeout_s=60)
    mu = torch.tensor(turn.logprobs)
    assert (trainer_logprobs(policy, [1], turn, 0.8) - mu).abs().max() < 1e-4
    base = AutoModelForCausalLM.from_pretrained(head_model_path, dtype=torch.float32)
    assert (trainer_logprobs(base, [1], turn, 0.8) - mu).abs().max() > 1e-2  # the adapter is in the weights


def test_only_the_tensors_written_since_the_last_push_travel(head_engine, head_model_path):
    # As with `model.train_last_layers=1`: after the first push, the frozen layers never travel again.
    model = AutoModelForCausalLM.from_pretrained(head_model_path, dtype=torch.float32)
    head_engine.push_weights(model.state_dict(), version=head_engine.version + 1)  # new tensors: all sent
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # in place, as an optimizer step writes
        for name, parameter in model.named_parameters():
            if name.startswith("model.layers.1."):
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    pushed = head_engine.push_weights(model.state_dict(), version=head_engine.version + 1)
    # Layer 1 of the tiny policy: q, k, v, o, gate, up, down, the q/k norms and the two layer norms, fp32.
    layer_1 = 128 * 128 + 64 * 128 + 64 * 128 + 128 * 128 + 3 * 256 * 128 + 64 + 64 + 128 + 128
    assert pushed.bytes == 4 * layer_1 == 591_360
    turn = head_engine.run(head_engine.generate([1], max_tokens=40, temperature=0.8, ignore_eos=True), timeout_s=60)
    assert turn.versions == [head_engine.version] * 40
    assert (trainer_logprobs(model, [1], turn, 0.8) - torch.tensor(turn.logprobs)).abs().max() < 1e-4
    # Nothing written since: nothing travels, and the tokens after it carry the new label.
    assert head_engine.push_weights(model.state_dict(), version=head_engine.version + 1).bytes == 0
    turn = head_engine.run(head_engine.generate([1], max_tokens=4, temperature=0.8, ignore_eos=True), timeout_s=60)
    assert turn.versions == [head_engine.version] * 4


def test_a_merged_adapter_on_some_projections_reaches_the_engine_whole(head_engine, head_model_path):
    # An adapter on q_proj and v_proj, pushed merged: after the first push only those two change, but
    # vLLM loads q, k and v as one qkv_proj, so k travels with them; sent alone, q and v would leave
    # k uninitialised in the engine.
    policy = adapted(head_model_path, rank=8, seed=4, target_modules=("q_proj", "v_proj"))
    head_engine.push_weights(merged_weights(policy), version=head_engine.version + 1)  # all: new tensors
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():  # an optimizer step on the adapter
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    pushed = head_engine.push_weights(merged_weights(policy), version=head_engine.version + 1)
    # Per layer: q 128x128, k and v 64x128; two layers, fp32.
    assert pushed.bytes == 4 * 2 * (128 * 128 + 2 * 64 * 128) == 262_144
    turn = head_engine.run(head_engine.generate([1], max_tokens=40, temperature=0.8, ignore_eos=True), timeout_s=60)
    assert (trainer_logprobs(policy, [1], turn, 0.8) - torch.tensor(turn.logprobs)).abs().max() < 1e-4


def test_a_full_fine_tunes_changed_elements_alone_reach_a_staged_engine(tiny_model_path):
    # `rollout.push_changed_elements`: after the first push, a tensor written in place travels as the
    # indices and values of the elements whose bits changed, written by the engine into its own copy.
    config = EngineSettings(
        dtype="float32",
        max_model_len=256,
        kv_cache_gib=SMALL_KV_CACHE_GIB,
        weight_transfer="staged",
        push_changed_elements=True,
    )
    engine = VLLMEngine(tiny_model_path, config)
    engine.start()
    try:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        parameters = {id(p): p for p in model.parameters()}.values()  # the tied embedding once
        assert engine.push_weights(model.state_dict(), version=1).bytes == 4 * sum(p.numel() for p in parameters)
        with (
            torch.no_grad()
        ):  # in place, as an optimizer step writes: 10 of the final norm's 128, 20 of the embedding's
            model.model.norm.weight[:10] += 1.0
            model.model.embed_tokens.weight[3, :20] += 0.5
        pushed = engine.push_weights(model.state_dict(), version=2)
        assert pushed.bytes == (10 + 20) * (4 + 4)  # an int32 index and an fp32 value each
        turn = engine.run(engine.generate([1, 3], max_tokens=40, temperature=0.8, ignore_eos=True), timeout_s=60)
        assert turn.versions == [2] * 40
        assert (trainer_logprobs(model, [1, 3], turn, 0.8) - torch.tensor(turn.logprobs)).abs().max() < 1e-4
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
        assert (
            trainer_logprobs(base, [1, 3], turn, 0.8) - torch.tensor(turn.logprobs)
        ).abs().max() > 1e-2  # the change arrived
    finally:
        engine.shutdown()
