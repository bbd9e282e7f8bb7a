"""A start that hangs, on the real engine: given up with where it stood, its processes ended."""

import os
import re
import shutil
import time

import pytest

from lit_asyncrl.rollout.engine.protocol import EngineStartTimeout
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
from tests.support.runs import SMALL_KV_CACHE_GIB


@pytest.mark.engine
def test_an_engine_core_that_hangs_is_reported_where_it_waits_and_ended(model_path, tmp_path):
    # The weights file is a named pipe nobody writes: the engine core blocks opening it as it loads
    # the model, after it took its name, and never answers the starting thread.
    folder = tmp_path / "model"
    shutil.copytree(model_path, folder)
    (folder / "model.safetensors").unlink()
    os.mkfifo(folder / "model.safetensors")
    engine = VLLMEngine(folder, EngineSettings(dtype="float32", max_model_len=256, kv_cache_gib=SMALL_KV_CACHE_GIB))
    engine.launch()

    with pytest.raises(EngineStartTimeout) as hang:
        engine.wait_until_serving(timeout_s=10)

    message = str(hang.value)
    assert message.startswith("vLLM engine did not start within 10 s (the starting thread was at ")
    assert "wait_for_engine_startup" in message  # vLLM's wait for the engine core's handshake
    (pid,) = re.findall(
        r"its process (\d+) \(EngineCore, titled 'VLLM::EngineCore'\) was in state S, waiting in wait_for_partner",
        message,
    )
    started = time.monotonic()
    engine.shutdown()
    assert time.monotonic() - started < 10  # the ended engine core made the start fail at once
    assert not os.path.exists(f"/proc/{pid}")
