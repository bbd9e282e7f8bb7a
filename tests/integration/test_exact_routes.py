"""Exact pi_old routes on one partial episode that spans three weight versions (real engine), on the
tiny policy and on the tiny mixture-of-experts policy."""

import asyncio
import threading

import pytest
import torch
from asyncrl_callbacks import SnapshotRetention
from transformers import AutoModelForCausalLM

from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.old_logits.dedicated import DedicatedWorker
from lit_asyncrl.rollout.old_logits.scoring import attach, collect_unscored, model_score_fn, score_requests
from lit_asyncrl.rollout.records import Trajectory, collate
from lit_asyncrl.scoring import token_logprobs

pytestmark = pytest.mark.engine
TEMPERATURE = 0.9


def perturbed(model, seed):
    copy = AutoModelForCausalLM.from_pretrained(model.name_or_path, dtype=torch.float32)
    copy.load_state_dict(model.state_dict())
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return copy


async def prompt_logprobs(engine, adapter, token_ids):
    """The engine's log-prob of each token of `token_ids` after its prefix, under `adapter` (a new LoRA id
    of the engine's), from vLLM's prompt log-probs: what the engine itself gives as an adapter's pi."""
    from vllm import SamplingParams

    request, _ = engine._adapters.write(adapter, version=0)
    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)
    final = None
    async for output in engine._llm.generate(
        {"prompt_token_ids": token_ids}, params, f"score-{request.lora_int_id}", lora_request=request
    ):
        final = output
    return [entry[token].logprob for entry, token in zip(final.prompt_logprobs[1:], token_ids[1:])]


def interrupt_and_score(engine, trajectory, model, version):
    """The interruption-sync route by hand: pause, score what lacks pi_old with `model`, attach."""
    engine.pause()

    async def collect():
        return collect_unscored([trajectory])

    requests = engine.run(collect())
    scores = score_requests(model_score_fn(model), requests, temperature=TEMPERATURE, top_k=-1, pad_id=0)

    async def write_back():
        return attach(requests, scores, version)

    return engine.run(write_back())


@pytest.fixture(params=["tiny", "tiny_moe"])
def routes_engine(request):
    """(engine, model path): the module's engine on the tiny policy, or one on the tiny MoE policy
    (the staged route, the one an MoE takes on CPU)."""
    if request.param == "tiny":
        yield request.getfixturevalue("engine"), request.getfixturevalue("tiny_model_path")
        return
    from lit_asyncrl.models import resolve_model_path
    from tests.support.small_engines import started_engine

    path = resolve_model_path("tiny_moe")
    engine = started_engine(path, weight_transfer="staged")
    yield engine, path
    engine.shutdown()


def test_three_routes_agree_with_each_tokens_own_version(routes_engine):
    from lit_asyncrl.models.lora import LoRASettings, engine_weights

    engine, model_path = routes_engine
    models = [AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)]
    models += [perturbed(models[0], seed) for seed in (1, 2)]
    versions_sent = [engine_weights(model, LoRASettings()) for model in models]  # as a run sends them
    base = engine.version
    snapshots = SnapshotRetention(max_staleness=3)
    snapshots.save_version(base, models[0])
    engine.push_weights(versions_sent[0], version=base)
    dedicated = DedicatedWorker(model_path, sampling=SamplingSettings(temperature=TEMPERATURE, top_k=-1), pad_id=0)
    dedicated.start(engine.loop)
    dedicated.send_weights(versions_sent[0], base)

    # The same streamed tokens feed two records: one per route that attaches pi_old to tokens.
    trajectory, dedicated_trajectory = Trajectory(group_id=0), Trajectory(group_id=0)
    for record in (trajectory, dedicated_trajectory):
        record.extend_context([1])

    streamed = threading.Condition()

    def on_tokens(ids, logprobs):
        for record in (trajectory, dedicated_trajectory):
            record.extend_policy(ids, logprobs, [engine.version] * len(ids))
        with streamed:
            streamed.notify_all()

    def wait_for_tokens(count: int) -> None:
        """Each swap waits until the turn has streamed `count` tokens (an event, not a delay)."""
        with streamed:
            assert streamed.wait_for(lambda: len(trajectory.token_ids) - 1 >= count, timeout=60)

    pending = asyncio.run_coroutine_threadsafe(
        engine.generate([1], max_tokens=240, temperature=TEMPERATURE, ignore_eos=True, on_tokens=on_tokens), engine.loop
    )
    for step in (1, 2):
        wait_for_tokens(40 * step)
        # Before version base+step-1 is replaced: score its tokens with its still-resident weights
        # (interruption-sync), and hand them to the dedicated worker before it moves on.
        interrupt_and_score(engine, trajectory, models[step - 1], base + step - 1)

        async def submit():
            dedicated.submit([dedicated_trajectory])

        engine.run(submit())
        dedicated.send_weights(versions_sent[step], base + step)
        snapshots.save_version(base + step, models[step])
        engine.push_weights(versions_sent[step], version=base + step)  # also resumes
    turn = pending.result(timeout=300)
    for record in (trajectory, dedicated_trajectory):
        assert record.set_versions(1, turn.versions) == 0  # no token was scored under a wrong version
    interrupt_and_score(engine, trajectory, models[2], base + 2)
    engine.resume()

    async def finish_dedicated():
        future = dedicated.submit([dedicated_trajectory])
        if future is not None:
            await future
        while dedicated.queue_depth:  # earlier fire-and-forget requests
            await asyncio.sleep(0.01)

    engine.run(finish_dedicated(), timeout_s=120)
    dedicated.stop()

    versions = torch.tensor(trajectory.versions[1:])
    assert sorted(set(versions.tolist())) == [base, base + 1, base + 2]  # one partial episode, three versions
    batch = collate([trajectory], pad_id=0)
    ids, mask = batch["input_ids"], batch["loss_mask"]

    # Ground truth: a forward of the model kept at each token's own version.
    with torch.no_grad():
        per_version = torch.stack(
            [token_logprobs(model, ids, batch["attention_mask"], TEMPERATURE)[0] for model in models]
        )
    truth = per_version[(batch["versions"][0] - base).clamp(min=0), torch.arange(ids.shape[1])][mask[0]]

    def score(forward, rows):
        logits = forward(input_ids=ids[rows], attention_mask=batch["attention_mask"][rows]).logits
        from lit_asyncrl.scoring import logits_to_token_logprobs

        return logits_to_token_logprobs(logits, ids[rows], TEMPERATURE)

    snapshot_route = snapshots.historical_logprobs(batch["versions"], mask, score, module=models[0])[mask]
    interrupt_route = batch["old_logprobs"][mask]
    dedicated_route = collate([dedicated_trajectory], pad_id=0)["old_logprobs"][mask]

    assert torch.isfinite(interrupt_route).all() and torch.isfinite(dedicated_route).all()
    assert (dedicated_route - truth).abs().max() < 1e-6
    assert (snapshot_route - truth).abs().max() < 1e-6
    assert (interrupt_route - truth).abs().max() < 1e-6
    assert snapshots.num_historical_forwards == 3  # one forward per distinct version
    # The engine's mu matches too (fp32), so each token really was sampled by the version it carries.
    assert (batch["behavior_logprobs"][mask] - truth).abs().max() < 1e-4


# Per model: the turn's length, the tokens between pushes, and the adapter's bytes by hand (fp32,
# rank 8, A and B of every targeted projection): the tiny policy (4 layers; q, k, v, o, up, gate,
# down) and SmolLM2-135M (30 layers of 576 wide, 192 for k and v, 1536 in the MLP).
ADAPTED_MODELS = {
    "tiny": (200, 40, 4 * 2 * 8 * (256 + 192 + 192 + 256 + 384 + 384 + 384)),
    "smollm2_135m": (60, 15, 4 * 30 * 8 * (2 * (576 + 576) + 2 * (576 + 192) + 3 * (576 + 1536))),
}


@pytest.mark.parametrize("model_name", ADAPTED_MODELS)
def test_with_adapters_as_versions_a_moved_turn_is_exact_on_every_route(model_name, request):
    # LoRA adapters as versions with `model.lora.in_flight=move`: at each push the turn in flight
    # moves to the new adapter, so its tokens carry three versions as with full weights, and the
    # three exact routes (interruption-sync and the dedicated worker scoring a version's tokens
    # before its adapter leaves, snapshots of the adapter alone) agree with a forward of the policy
    # under each token's own adapter, as does the engine's mu: each token was sampled by its version.
    # On the tiny policy and on the real model.
    from peft import set_peft_model_state_dict

    from lit_asyncrl.models import resolve_model_path
    from lit_asyncrl.models.lora import LoRASettings, adapter_weights
    from lit_asyncrl.rollout.engine.settings import EngineSettings
    from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
    from tests.support.lora import adapted
    from tests.support.runs import SMALL_KV_CACHE_GIB

    model_path = request.getfixturevalue("tiny_model_path") if model_name == "tiny" else resolve_model_path(model_name)
    turn_tokens, tokens_per_version, adapter_bytes = ADAPTED_MODELS[model_name]
    settings = LoRASettings(rank=8, in_flight="move")
    policies = [adapted(model_path, rank=8, seed=seed) for seed in (1, 2, 3)]
    adapters = [{name: tensor.clone() for name, tensor in adapter_weights(policy).items()} for policy in policies]
    live = adapted(model_path, rank=8, seed=0)  # the trainer's module, given each version's adapter in turn
    config = EngineSettings(dtype="float32", max_model_len=256, kv_cache_gib=SMALL_KV_CACHE_GIB, lora=settings)
    engine = VLLMEngine(model_path, config)
    engine.start()
    dedicated = DedicatedWorker(
        model_path, sampling=SamplingSettings(temperature=TEMPERATURE, top_k=-1), pad_id=0, lora=settings
    )
    try:
        snapshots = SnapshotRetention(max_staleness=3)

        def publish(version):
            set_peft_model_state_dict(live, adapters[version - 1])
            snapshots.save_version(version, live)  # the adapter only: the base is read from `live`
            dedicated.send_weights(adapters[version - 1], version)
            return engine.push_weights(adapters[version - 1], version=version)

        dedicated.start(engine.loop)
        assert publish(1).bytes == adapter_bytes
        trajectory, dedicated_trajectory = Trajectory(group_id=0), Trajectory(group_id=0)
        for record in (trajectory, dedicated_trajectory):
            record.extend_context([1])
        streamed = threading.Condition()

        def on_tokens(ids, logprobs):
            for record in (trajectory, dedicated_trajectory):
                record.extend_policy(ids, logprobs, [engine.version] * len(ids))
            with streamed:
                streamed.notify_all()

        pending = asyncio.run_coroutine_threadsafe(
            engine.generate([1], max_tokens=turn_tokens, temperature=TEMPERATURE, ignore_eos=True, on_tokens=on_tokens),
            engine.loop,
        )
        for version in (1, 2):
            with streamed:
                assert streamed.wait_for(
                    lambda count=tokens_per_version * version: len(trajectory.token_ids) - 1 >= count, timeout=60
                )
            interrupt_and_score(engine, trajectory, policies[version - 1], version)

            async def submit():
                dedicated.submit([dedicated_trajectory])

            engine.run(submit())
            publish(version + 1)  # resumes the engine, moving the turn to the new adapter
        turn = pending.result(timeout=300)
        for record in (trajectory, dedicated_trajectory):
            assert record.set_versions(1, turn.versions) == 0  # no token was scored under a wrong version
        interrupt_and_score(engine, trajectory, policies[2], 3)
        engine.resume()

        async def finish_dedicated():
            future = dedicated.submit([dedicated_trajectory])
            if future is not None:
                await future
            while dedicated.queue_depth:
                await asyncio.sleep(0.01)

        engine.run(finish_dedicated(), timeout_s=120)
        # The engine scoring the finished turn under each version's adapter again (prompt log-probs,
        # which vLLM computes before temperature: compared at temperature 1 below).
        sequence = [1, *turn.token_ids]
        engine_scored = [engine.run(prompt_logprobs(engine, adapter, sequence), timeout_s=120) for adapter in adapters]
    finally:
        dedicated.stop()
        engine.shutdown()

    assert len(turn.token_ids) == turn_tokens and turn.finish_reason == "length"  # one turn, continued across two moves
    versions = torch.tensor(trajectory.versions[1:])
    assert sorted(set(versions.tolist())) == [1, 2, 3]
    assert versions.diff().ge(0).all()  # a moved turn never goes back to an older adapter
    batch = collate([trajectory], pad_id=0)
    ids, mask = batch["input_ids"], batch["loss_mask"]
    with torch.no_grad():
        per_version = torch.stack(
            [token_logprobs(policy, ids, batch["attention_mask"], TEMPERATURE)[0] for policy in policies]
        )
    truth = per_version[batch["versions"][0].clamp(min=1) - 1, torch.arange(ids.shape[1])][mask[0]]

    def score(forward, rows):
        from lit_asyncrl.scoring import logits_to_token_logprobs

        logits = forward(input_ids=ids[rows], attention_mask=batch["attention_mask"][rows]).logits
        return logits_to_token_logprobs(logits, ids[rows], TEMPERATURE)

    snapshot_route = snapshots.historical_logprobs(batch["versions"], mask, score, module=live)[mask]
    interrupt_route = batch["old_logprobs"][mask]
    dedicated_route = collate([dedicated_trajectory], pad_id=0)["old_logprobs"][mask]
    assert torch.isfinite(interrupt_route).all() and torch.isfinite(dedicated_route).all()
    for route in (snapshot_route, interrupt_route, dedicated_route):
        assert (route - truth).abs().max() < 1e-6
    other = per_version[(batch["versions"][0] % 3), torch.arange(ids.shape[1])][
        mask[0]
    ]  # each token under another version
    assert (other - truth).abs().max() > 1e-2  # so a wrong adapter would show
    assert (batch["behavior_logprobs"][mask] - truth).abs().max() < 1e-4
    # The engine's own scores under an older adapter equal the trainer's under it, at temperature 1:
    # a route to pi_old with no trainer-side forward, not wired as a reference (docs/models.md says why).
    with torch.no_grad():
        at_one = torch.stack([token_logprobs(policy, ids, batch["attention_mask"], 1.0)[0] for policy in policies])
    for version in (1, 2, 3):
        assert (torch.tensor(engine_scored[version - 1]) - at_one[version - 1, 1:]).abs().max() < 1e-4
    assert (torch.tensor(engine_scored[0]) - at_one[1, 1:]).abs().max() > 1e-2  # another adapter's scores differ
