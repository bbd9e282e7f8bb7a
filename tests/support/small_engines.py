"""A started vLLM engine, and an async rollout service, on a model and with a small KV cache."""

from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
from lit_asyncrl.rollout.serving.vllm_service import VLLMRolloutService
from lit_asyncrl.rollout.settings import RolloutConfig
from tests.support.runs import SMALL_KV_CACHE_GIB


def started_engine(
    model_path,
    dtype: str = "float32",
    weight_transfer: str = "file",
    max_model_len: int = 256,
    capture_routing: bool = False,
) -> VLLMEngine:
    """A started engine on `model_path` (~20 s for the tiny policy); the caller shuts it down."""
    config = EngineSettings(
        dtype=dtype,
        max_model_len=max_model_len,
        weight_transfer=weight_transfer,
        kv_cache_gib=SMALL_KV_CACHE_GIB,
        capture_routing=capture_routing,
    )
    engine = VLLMEngine(model_path, config)
    engine.start()
    return engine


def small_async_service(model_path, env) -> VLLMRolloutService:
    """An async rollout service of 4 groups of 4 episodes on one fp32 engine (not started)."""
    settings = RolloutConfig.from_keys(
        group_size=4,
        groups_per_batch=4,
        max_version_gap=3,
        buffer_capacity=16,
        max_concurrent_groups=4,
        max_model_len=256,
        kv_cache_gib=SMALL_KV_CACHE_GIB,
    )
    return VLLMRolloutService(model_path, env, settings, seed=0)
