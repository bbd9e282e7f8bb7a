"""Engines for frozen models that tasks ask for (`envs/resources.py`): a simulated user's model."""

from __future__ import annotations

from lit_asyncrl.envs.resources import FrozenModel
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine


def start_frozen_engine(model: FrozenModel) -> VLLMEngine:
    """A started engine serving `model` in this process; no version is ever pushed to it."""
    settings = EngineSettings(
        dtype=model.dtype, max_model_len=model.max_model_len, kv_cache_gib=model.kv_cache_bytes / 2**30
    )
    engine = VLLMEngine(model.path, settings, seed=model.seed)
    try:
        engine.start()
    except BaseException:
        engine.shutdown()
        raise
    return engine
