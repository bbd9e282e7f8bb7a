"""Run by `test_scale_out.py` in a process of its own, on a Ray instance this process starts: an
engine in a Ray actor keeps the engine protocol on each route an actor's engine takes (its weights
pushed over vLLM's weight-transfer API, gloo through vLLM's Ray client, or through Ray's object
store), and the dedicated old-logit worker in a Ray actor scores the engine's tokens exactly; then
the process waits to be killed outright, the actors still up.

    python -m tests.integration.ray_contract_run
"""

import asyncio
import functools
import math
import sys
import time

import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.old_logits.dedicated import DedicatedWorker
from lit_asyncrl.rollout.ray_actors.dedicated_worker import DedicatedWorkerActor
from lit_asyncrl.rollout.ray_actors.engine import RayEngine
from lit_asyncrl.rollout.ray_actors.placement import RayPlacement
from lit_asyncrl.rollout.records import Trajectory
from tests.integration.engine_contract import check_engine_contract
from tests.support.runs import SMALL_KV_CACHE_GIB

#: Printed once every check held; the test kills this process when it reads it.
KEPT = "the Ray actors kept their promises"
#: The largest |pi_old - mu| of one token: fp32 on both sides, so only summation order differs
#: (a version off by one, or a tensor that did not arrive whole, shows 1e-2 or more).
EXACT = 1e-4


def perturbed_weights(model_path: str) -> dict[str, torch.Tensor]:
    """The policy's weights moved away from the engine's start, so that a push that did not arrive
    (or arrived in part) shows; moved by parameter, so a tied head stays tied."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=generator))
    return model.state_dict()


def check_dedicated_actor_scores_exactly(
    engine: RayEngine, weights: dict[str, torch.Tensor], model_path: str, placement: RayPlacement
) -> None:
    """pi_old from the dedicated worker's actor, holding the engine's version, equals the engine's mu."""
    turn = engine.run(engine.generate([1], max_tokens=32, temperature=1.0, ignore_eos=True), timeout_s=60)
    assert turn.versions == [engine.version] * 32
    trajectory = Trajectory(group_id=0)
    trajectory.extend_context([1])
    trajectory.extend_policy(turn.token_ids, turn.logprobs, turn.versions)
    worker = DedicatedWorker(
        model_path,
        sampling=SamplingSettings(temperature=1.0, top_k=-1),
        pad_id=0,
        worker_factory=functools.partial(DedicatedWorkerActor, placement=placement),
    )
    worker.start(engine.loop)
    worker.send_weights(weights, engine.version)

    async def scored() -> int:
        return await worker.submit([trajectory])

    assert asyncio.run_coroutine_threadsafe(scored(), engine.loop).result(timeout=120) == 32
    assert worker.dead_reason() is None
    assert trajectory.old_versions[1:] == turn.versions
    gaps = [abs(old - mu) for old, mu in zip(trajectory.old_logprobs[1:], turn.logprobs)]
    assert all(math.isfinite(gap) for gap in gaps) and max(gaps) < EXACT, max(gaps)


if __name__ == "__main__":
    model_path = str(resolve_model_path(None))
    placement = RayPlacement(num_cpus=0.5)
    weights = perturbed_weights(model_path)
    # Every route an engine in an actor takes: vLLM's weight-transfer API from this process
    # (`TransferRoute`), and the tensors through Ray's object store to the actor's engine (`ActorRoute`).
    engines = {}
    for route in ("gloo", "file"):
        config = EngineSettings(max_model_len=256, kv_cache_gib=SMALL_KV_CACHE_GIB, weight_transfer=route)
        engines[route] = RayEngine(model_path, config, placement)
        engines[route].start()
        check_engine_contract(engines[route], weights)  # pushes `weights` as the next version
    check_dedicated_actor_scores_exactly(engines["gloo"], weights, model_path, placement)
    print(KEPT, flush=True)
    time.sleep(600)  # killed here, the actors and the Ray instance still up
    sys.exit(1)
