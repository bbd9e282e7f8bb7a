"""Which engine and which vLLM arguments a configuration selects (no engine starts)."""

import functools

import pytest

from lit_asyncrl.datamodule import _placement
from lit_asyncrl.rollout.dedicated import ProcessWorker
from lit_asyncrl.rollout.engine import VLLMEngine
from lit_asyncrl.rollout.engine_config import EngineConfig, parallelism_args


def test_parallelism_passes_through_on_gpus():
    config = EngineConfig(tensor_parallel_size=4, data_parallel_size=2)
    assert parallelism_args(config, "cuda") == {"tensor_parallel_size": 4, "data_parallel_size": 2}
    assert parallelism_args(EngineConfig(), "cpu") == {"tensor_parallel_size": 1, "data_parallel_size": 1}


def test_parallelism_inside_an_engine_is_refused_on_cpu_naming_the_keys():
    with pytest.raises(ValueError, match=r"data.tensor_parallel_size=2 .* needs GPUs; on CPU use data.num_engines"):
        parallelism_args(EngineConfig(tensor_parallel_size=2), "cpu")
    with pytest.raises(ValueError, match=r"data.data_parallel_size must be an integer >= 1, got 0"):
        parallelism_args(EngineConfig(data_parallel_size=0), "cuda")


def test_placement_selects_where_engines_and_the_old_logit_worker_run():
    assert _placement("local", None, 1.0, 0.0) == {"engine_factory": VLLMEngine, "old_logit_worker_factory": ProcessWorker}
    pytest.importorskip("ray")
    from lit_asyncrl.rollout.ray_engine import RayEngine
    from lit_asyncrl.rollout.ray_placement import RayPlacement
    from lit_asyncrl.rollout.ray_worker import RayWorker

    chosen = _placement("ray", "auto", 0.5, 1.0)
    expected = {"placement": RayPlacement(address="auto", num_cpus=0.5, num_gpus=1.0)}
    for key, cls in (("engine_factory", RayEngine), ("old_logit_worker_factory", RayWorker)):
        assert isinstance(chosen[key], functools.partial) and chosen[key].func is cls
        assert chosen[key].keywords == expected


def test_bad_placements_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="data.placement must be 'local' or 'ray', got 'slurm'"):
        _placement("slurm", None, 1.0, 0.0)
    with pytest.raises(ValueError, match="data.ray_cpus_per_engine must be > 0"):
        _placement("ray", None, 0.0, 0.0)
