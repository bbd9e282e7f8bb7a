"""Which engine and which vLLM arguments a configuration selects (no engine starts)."""

import functools

import pytest

from lit_asyncrl.rollout.engine.settings import EngineSettings, parallelism_args
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
from lit_asyncrl.rollout.old_logits.dedicated import DedicatedWorkerProcess
from lit_asyncrl.rollout.serving.placement import placement_factories
from lit_asyncrl.rollout.settings import RolloutConfig, ScaleOutSettings


def test_parallelism_passes_through_on_gpus():
    config = EngineSettings(tensor_parallel_size=4, data_parallel_size=2)
    assert parallelism_args(config, "cuda") == {"tensor_parallel_size": 4, "data_parallel_size": 2}
    assert parallelism_args(EngineSettings(), "cpu") == {"tensor_parallel_size": 1, "data_parallel_size": 1}


def test_parallelism_inside_an_engine_is_refused_on_cpu_naming_the_keys():
    with pytest.raises(
        ValueError, match=r"rollout.tensor_parallel_size=2 .* needs GPUs; on CPU use rollout.num_engines"
    ):
        parallelism_args(EngineSettings(tensor_parallel_size=2), "cpu")
    with pytest.raises(ValueError, match=r"rollout.data_parallel_size must be an integer >= 1, got 0"):
        parallelism_args(EngineSettings(data_parallel_size=0), "cuda")


def test_placement_selects_where_engines_and_the_old_logit_worker_run():
    assert placement_factories(ScaleOutSettings()) == (VLLMEngine, DedicatedWorkerProcess)
    pytest.importorskip("ray")
    from lit_asyncrl.rollout.ray_actors.dedicated_worker import DedicatedWorkerActor
    from lit_asyncrl.rollout.ray_actors.engine import RayEngine
    from lit_asyncrl.rollout.ray_actors.placement import RayPlacement

    chosen = placement_factories(
        ScaleOutSettings(placement="ray", ray_address="auto", ray_cpus_per_engine=0.5, ray_gpus_per_engine=1.0)
    )
    expected = {"placement": RayPlacement(address="auto", num_cpus=0.5, num_gpus=1.0)}
    for factory, cls in zip(chosen, (RayEngine, DedicatedWorkerActor)):
        assert isinstance(factory, functools.partial) and factory.func is cls
        assert factory.keywords == expected


def test_bad_placements_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="rollout.placement must be 'local' or 'ray', got 'slurm'"):
        RolloutConfig.from_keys(placement="slurm")
    with pytest.raises(ValueError, match="rollout.ray_cpus_per_engine must be > 0"):
        RolloutConfig.from_keys(placement="ray", ray_cpus_per_engine=0.0)
