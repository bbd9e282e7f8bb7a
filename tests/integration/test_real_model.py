"""The real pretrained model (SmolLM2-135M-Instruct, ChatML) on the real engine.

1. A multi-turn chat episode: every request the engine receives is the trajectory's own prefix,
   and every turn it returns follows that prefix in the trajectory: the ids the trainer scores are
   the ids the engine saw, turn by turn.
2. One turn spanning an in-place weight update: the trainer's log-probs at each token's own
   version against the engine's mu. fp32 engine: within 1e-4. bf16 engine (the paper's setting):
   measured, finite, printed (`pytest -s`), and far above the fp32 engine's.
3. One episode across a LoRA adapter push: each turn on its own adapter, exactly.
"""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
import torch
from peft import set_peft_model_state_dict
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_asyncrl.envs import ServiceDeskEnv, ServiceDeskToolsEnv
from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.models.lora import LoRASettings, adapter_weights
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
from lit_asyncrl.rollout.episodes.env_calls import EnvCaller
from lit_asyncrl.rollout.episodes.for_task import episode_format_for
from lit_asyncrl.rollout.episodes.formats import ChatTemplateFormat
from lit_asyncrl.rollout.episodes.runner import EpisodeSettings, play_episode
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.episodes.tool_calls import ChatToolFormat
from lit_asyncrl.rollout.records import Trajectory
from lit_asyncrl.rollout.serving.instances import training_instance
from lit_asyncrl.scoring import token_logprobs
from lit_asyncrl.warm_start import WarmStart
from tests.support.lora import adapted
from tests.support.runs import SMALL_KV_CACHE_GIB
from tests.support.small_engines import started_engine

# One xdist worker runs this module's tests: they share module-scoped runs or engines.
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("test_real_model")]


@pytest.fixture(scope="module")
def smollm2_path():
    return resolve_model_path("smollm2_135m")


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="module")
def fp32_engine(smollm2_path):
    engine = started_engine(smollm2_path, "float32", max_model_len=1024)  # a tool task's opening holds the schemas
    yield engine
    engine.shutdown()


def test_a_chat_episode_scores_exactly_the_ids_the_engine_saw(fp32_engine, tokenizer):
    env = ServiceDeskEnv(max_turns=3)
    episode_format = episode_format_for(tokenizer, env)
    assert isinstance(episode_format, ChatTemplateFormat) and episode_format.observation_role == "tool"
    calls: list[tuple[list[int], list[int]]] = []
    generate = fp32_engine.generate

    async def recording_generate(prompt_ids, **kwargs):
        turn = await generate(prompt_ids, **kwargs)
        calls.append((list(prompt_ids), list(turn.token_ids)))
        return turn

    fp32_engine.generate = recording_generate
    caller = EnvCaller(max_workers=1)
    try:
        instance = training_instance(env, random.Random(0))
        settings = EpisodeSettings(
            call_env=caller, sampling=SamplingSettings(temperature=1.0, top_k=-1), max_context=256
        )
        coroutine = play_episode(fp32_engine, env, episode_format, instance, Trajectory(group_id=0), settings)
        trajectory = fp32_engine.run(coroutine, timeout_s=120)
    finally:
        caller.close()
        del fp32_engine.generate

    assert len(calls) == trajectory.num_turns >= 2  # a multi-turn conversation
    policy_positions = []
    for prompt, completion in calls:
        assert trajectory.token_ids[: len(prompt)] == prompt
        assert trajectory.token_ids[len(prompt) : len(prompt) + len(completion)] == completion
        policy_positions += range(len(prompt), len(prompt) + len(completion))
    assert [index for index, mask in enumerate(trajectory.loss_mask) if mask] == policy_positions
    im_end, assistant = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.encode("<|im_start|>assistant\n")
    for prompt, _ in calls:
        assert prompt[-len(assistant) :] == assistant  # each request ends with the generation prompt
    later_prompts = [prompt for prompt, _ in calls[1:]]
    # Each earlier turn is closed by <|im_end|> (sampled, or added as context when cut short), and
    # the environment's answer comes as a tool message.
    for (prompt, completion), later in zip(calls, later_prompts):
        assert later[len(prompt) + len(completion) - (completion[-1:] == [im_end])] == im_end
    assert "<|im_start|>tool\n" in tokenizer.decode(trajectory.token_ids)
    assert tokenizer.decode(trajectory.token_ids).startswith(
        f"<|im_start|>system\n{env.system_prompt}<|im_end|>\n<|im_start|>user\n"
    )


def test_after_a_short_warm_start_smollm2_calls_a_json_tool_that_runs_and_answers(fp32_engine, smollm2_path, tokenizer):
    # The JSON-tool desk in the Hermes fallback (SmolLM2's template ignores `tools=`): a few
    # supervised steps on tool-call transcripts, the weights pushed, then episodes sampled by the
    # engine itself (no scripted prefix) until one turn holds a call vLLM's hermes parser reads.
    env = ServiceDeskToolsEnv(max_turns=3)
    episode_format = episode_format_for(tokenizer, env)
    assert isinstance(episode_format, ChatToolFormat) and not episode_format.template_renders_tools
    policy = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    for parameter in policy.model.layers[:-2].parameters():  # the last 2 layers, as model=smollm2_135m trains
        parameter.requires_grad_(False)
    # 4 steps of one transcript at 6e-4: each of seeds 0-5 then called a tool (measured; 22 s of
    # the warm start on 2 cores, against 149 s for 16 steps of two at 3e-4).
    WarmStart(steps=4, lr=6e-4, batch_size=1).run(policy, env, tokenizer, enable_progress_bar=False)
    fp32_engine.push_weights(policy.state_dict(), version=fp32_engine.version + 1)

    calls: list[tuple[list[int], list[int], list[float]]] = []
    generate = fp32_engine.generate

    async def recording_generate(prompt_ids, **kwargs):
        turn = await generate(prompt_ids, **kwargs)
        calls.append((list(prompt_ids), list(turn.token_ids), list(turn.logprobs)))
        return turn

    fp32_engine.generate = recording_generate
    caller = EnvCaller(max_workers=1)
    try:
        for seed in range(6):
            calls.clear()
            instance = training_instance(env, random.Random(seed))
            settings = EpisodeSettings(
                call_env=caller, sampling=SamplingSettings(temperature=0.7, top_k=-1), max_context=1024, seed=seed
            )
            trajectory = fp32_engine.run(
                play_episode(fp32_engine, env, episode_format, instance, Trajectory(group_id=0), settings),
                timeout_s=300,
            )
            if sum(trajectory.tool_calls.values()) > 0:
                break
    finally:
        caller.close()
        del fp32_engine.generate
    assert sum(trajectory.tool_calls.values()) > 0, tokenizer.decode(trajectory.token_ids)[-600:]

    # The first turn holding a call: sampled tokens with their mu, read by the parser, the tool run.
    turn_with_call = next(
        index for index, (_, completion, _) in enumerate(calls) if episode_format.action(completion).calls
    )
    prompt, completion, mu = calls[turn_with_call]
    assert len(mu) == len(completion) and all(value <= 0 for value in mu)
    parsed = episode_format.action(completion)
    assert "<tool_call>" in tokenizer.decode(completion)
    assert parsed.calls[0].name in {"look", "refund", "cancel", "reply"}
    # Its answers follow as a user message of <tool_response> blocks (the fallback's rendering).
    after = tokenizer.decode(trajectory.token_ids[len(prompt) + len(completion) :])
    assert after.startswith("\n<|im_start|>user\n<tool_response>\n") or parsed.calls[-1].name == "reply"
    # The trained ids are the engine's and the policy mask is exactly the model's turns.
    policy_positions = []
    for prompt, completion, _ in calls:
        assert trajectory.token_ids[: len(prompt)] == prompt
        assert trajectory.token_ids[len(prompt) : len(prompt) + len(completion)] == completion
        policy_positions += range(len(prompt), len(prompt) + len(completion))
    assert [index for index, mask in enumerate(trajectory.loss_mask) if mask] == policy_positions


def test_an_openai_sdk_agent_through_the_agent_endpoint_is_recorded_exactly(fp32_engine, tokenizer):
    # An agent as a user writes one, against the real openai SDK, through the endpoint over this engine:
    # three calls (a tool result or a follow-up request after each answer), then one with an edited
    # history. Every recorded id is the engine's; the continued calls are one trajectory, the edited one
    # opens a second segment, each exact.
    import openai

    from lit_asyncrl.rollout.agent_endpoint.conversation import AgentConversation
    from lit_asyncrl.rollout.agent_endpoint.server import AgentEndpoint, AgentEpisode
    from tests.support.shopping_task import ADD_SCHEMA, ShoppingTask

    tools = [ADD_SCHEMA]
    outputs: list[tuple[list[int], object]] = []
    generate = fp32_engine.generate

    async def recording_generate(prompt_ids, **kwargs):
        turn = await generate(prompt_ids, **kwargs)
        outputs.append((list(prompt_ids), turn))
        return turn

    fp32_engine.generate = recording_generate
    sampling = SamplingSettings(1.0, -1)
    served = AgentEndpoint(tokenizer, sampling)
    conversation = AgentConversation(episode_format_for(tokenizer, ShoppingTask()), Trajectory(group_id=5))
    episode = AgentEpisode(conversation, fp32_engine, sampling, max_turn_tokens=48, max_context=1024)
    served.start()
    try:
        url = served.open_episode(episode)
        client = openai.OpenAI(base_url=url, api_key=served.token, max_retries=0)
        messages = [{"role": "user", "content": "Please add a mug to my basket."}]
        for follow_up in ("Now add a hat.", "Thanks, that is all.", None):
            message = client.chat.completions.create(model="smollm2", messages=messages, tools=tools).choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "added"})
            if not message.tool_calls and follow_up is not None:
                messages.append({"role": "user", "content": follow_up})
        edited = [{"role": "user", "content": "Please add two mugs."}, *messages[1:]]
        if edited[-1]["role"] == "assistant":
            edited.append({"role": "user", "content": "And a cup."})
        client.chat.completions.create(model="smollm2", messages=edited, tools=tools)
        served.close_episode(episode)
        first, second = conversation.segments
    finally:
        served.stop()
        del fp32_engine.generate
    assert len(outputs) == 4 and (first.num_turns, second.num_turns) == (3, 1)
    for segment, calls in ((first, outputs[:3]), (second, outputs[3:])):
        sampled = []
        for prompt, turn in calls:
            assert segment.token_ids[: len(prompt)] == prompt  # every call's prompt is its segment so far
            assert segment.token_ids[len(prompt) : len(prompt) + len(turn.token_ids)] == turn.token_ids
            assert segment.behavior_logprobs[len(prompt) : len(prompt) + len(turn.token_ids)] == turn.logprobs
            assert segment.versions[len(prompt) : len(prompt) + len(turn.token_ids)] == turn.versions
            sampled += range(len(prompt), len(prompt) + len(turn.token_ids))
        assert [index for index, mine in enumerate(segment.loss_mask) if mine] == sampled


def perturbed_copy(path, seed: int) -> torch.nn.Module:
    """The model with its last two layers shifted: a later weight version."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.model.layers[-2:].parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model


def turn_in_flight(engine: VLLMEngine, prompt: list[int], max_tokens: int, temperature: float, after: int):
    """A turn started on the engine's loop: (its future, [tokens streamed so far], an event set once
    `after` tokens have streamed), so a push can land in the middle of it."""
    streamed, reached = [0], threading.Event()

    def on_tokens(ids, logprobs):
        streamed[0] += len(ids)
        if streamed[0] >= after:
            reached.set()

    turn = engine.generate(prompt, max_tokens=max_tokens, temperature=temperature, ignore_eos=True, on_tokens=on_tokens)
    return asyncio.run_coroutine_threadsafe(turn, engine.loop), streamed, reached


def one_turn_across_an_update(engine: VLLMEngine, old_model, new_model, prompt: list[int], temperature: float):
    """(mu, versions, pi at the old version, pi at the new version) for a turn with a mid-turn swap."""
    old_version = engine.version
    engine.push_weights(old_model.state_dict(), version=old_version)
    pending, _, enough_old_tokens = turn_in_flight(engine, prompt, max_tokens=60, temperature=temperature, after=12)
    assert enough_old_tokens.wait(120)
    # Paused at once: writing 538 MB of weights takes longer than the rest of the turn would, and
    # the swap must come in the middle of the turn (the push resumes generation when it is done).
    engine.pause()
    engine.push_weights(new_model.state_dict(), version=old_version + 1)
    turn = pending.result(timeout=300)
    ids = torch.tensor([prompt + turn.token_ids])
    with torch.no_grad():
        old_pi, new_pi = (
            token_logprobs(m, ids, torch.ones_like(ids), temperature)[0, len(prompt) :] for m in (old_model, new_model)
        )
    return torch.tensor(turn.logprobs), torch.tensor(turn.versions), old_pi, new_pi, old_version


def own_version_gap(engine, smollm2_path, tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """|log pi(own version) - log mu| per token, and the same against the other version."""
    old_model, new_model = perturbed_copy(smollm2_path, seed=1), perturbed_copy(smollm2_path, seed=2)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Tell me about the sea."}], add_generation_prompt=True, tokenize=False
    )
    mu, versions, old_pi, new_pi, old_version = one_turn_across_an_update(
        engine, old_model, new_model, tokenizer.encode(prompt, add_special_tokens=False), temperature=1.0
    )
    cut = int((versions == old_version).sum())
    assert 0 < cut < len(versions)  # one switch, old tokens then new ones
    assert versions[:cut].eq(old_version).all() and versions[cut:].eq(old_version + 1).all()
    own = torch.cat([old_pi[:cut], new_pi[cut:]])
    other = torch.cat([new_pi[:cut], old_pi[cut:]])
    return (own - mu).abs(), (other - mu).abs(), versions


def test_fp32_engine_mu_equals_the_trainers_log_probs_at_each_tokens_own_version(fp32_engine, smollm2_path, tokenizer):
    own, other, _ = own_version_gap(fp32_engine, smollm2_path, tokenizer)
    print(f"\nfp32 engine: |log pi_own - log mu| mean {own.mean():.2e} max {own.max():.2e} over {own.numel()} tokens")
    assert own.max() < 1e-4
    assert other.max() > 1e-2  # a version tag one token off would fail the line above


def test_bf16_engine_gap_is_measured_and_finite(smollm2_path, tokenizer):
    engine = started_engine(smollm2_path, "bfloat16")
    try:
        own, other, _ = own_version_gap(engine, smollm2_path, tokenizer)
    finally:
        engine.shutdown()
    print(f"\nbf16 engine: |log pi_own - log mu| mean {own.mean():.4f} max {own.max():.4f} over {own.numel()} tokens")
    assert torch.isfinite(own).all()
    # The paper's training-inference gap: far above fp32 numerical noise (measured mean ~3e-2).
    assert 1e-3 < own.mean() < 0.5


def test_an_episode_across_an_adapter_push_keeps_each_turns_adapter_exactly(smollm2_path, tokenizer):
    # LoRA adapters as versions (`model.lora.push=adapter`): a turn in flight at a push finishes on
    # the adapter it started with, the next turn runs under the new one; the fp32 engine's mu equals
    # the trainer's peft policy at each turn's own version within 1e-4, and not the other's.
    settings = LoRASettings(rank=8)
    config = EngineSettings(dtype="float32", max_model_len=256, kv_cache_gib=SMALL_KV_CACHE_GIB, lora=settings)
    engine = VLLMEngine(smollm2_path, config)
    engine.start()
    try:
        policy = adapted(smollm2_path, rank=8, seed=1)
        first = {name: tensor.clone() for name, tensor in adapter_weights(policy).items()}
        engine.push_weights(first, version=1)
        prompt = tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": "Tell me about the sea."}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        pending, streamed, started = turn_in_flight(engine, prompt, max_tokens=40, temperature=1.0, after=8)
        assert started.wait(120)
        second = {
            name: tensor + 0.05 * torch.randn_like(tensor) if ".lora_B." in name else tensor
            for name, tensor in first.items()
        }
        pushed = engine.push_weights(second, version=2)  # while the first turn is in flight
        assert pushed.bytes == 4 * 30 * 8 * (2 * (576 + 576) + 2 * (576 + 192) + 3 * (576 + 1536)) == 9_768_960
        first_turn = pending.result(timeout=300)
        assert streamed[0] == 40 > 8 and first_turn.versions == [1] * 40  # finished on its adapter
        context = prompt + first_turn.token_ids + tokenizer.encode("\nAnd the sky?\n", add_special_tokens=False)
        second_turn = engine.run(
            engine.generate(context, max_tokens=20, temperature=1.0, ignore_eos=True), timeout_s=300
        )
        assert second_turn.versions == [2] * 20
    finally:
        engine.shutdown()
    pi = {}
    for version, adapter in ((1, first), (2, second)):
        set_peft_model_state_dict(policy, adapter)
        for turn, start in ((first_turn, prompt), (second_turn, context)):
            ids = torch.tensor([start + turn.token_ids])
            with torch.no_grad():
                pi[version, len(start)] = token_logprobs(policy, ids, torch.ones_like(ids), 1.0)[0, len(start) :]
    own = torch.cat([pi[1, len(prompt)], pi[2, len(context)]])
    other = torch.cat([pi[2, len(prompt)], pi[1, len(context)]])
    mu = torch.tensor(first_turn.logprobs + second_turn.logprobs)
    assert (own - mu).abs().max() < 1e-4
    assert (other - mu).abs().max() > 1e-2
