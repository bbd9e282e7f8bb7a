"""Engine starts on the real engine: one that hangs is given up with where it stood and its processes ended;
a launch returns once the start adds nothing more to the environment."""

import multiprocessing
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from lit_asyncrl.rollout.engine.protocol import EngineStartTimeout
from lit_asyncrl.rollout.engine.settings import EngineSettings
from lit_asyncrl.rollout.engine.vllm_engine import VLLMEngine
from lit_asyncrl.rollout.processes.core_semaphores import UNNAMED_LOCKS_VARIABLE
from tests.support.polling import wait_for
from tests.support.runs import SMALL_KV_CACHE_GIB


def an_engine_core_waits_for_a_writer() -> bool:
    """A child of this process titled as vLLM's engine core is blocked opening a named pipe."""
    for child in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        for pid in child.read_text().split():
            try:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                waiting_in = Path(f"/proc/{pid}/wchan").read_text()
            except OSError:  # gone meanwhile
                continue
            if title == b"VLLM::EngineCore" and waiting_in == "wait_for_partner":
                return True
    return False


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

    # Once the engine core hangs, a short timeout reports the same as a long one, sooner.
    wait_for(an_engine_core_waits_for_a_writer, "the engine core to block on the named pipe", timeout_s=60)
    with pytest.raises(EngineStartTimeout) as hang:
        engine.wait_until_serving(timeout_s=1)

    message = str(hang.value)
    assert message.startswith("vLLM engine did not start within 1 s (the starting thread was at ")
    assert "wait_for_engine_startup" in message  # vLLM's wait for the engine core's handshake
    (pid,) = re.findall(
        r"its process (\d+) \(EngineCore, titled 'VLLM::EngineCore'\) was in state S, waiting in wait_for_partner",
        message,
    )
    started = time.monotonic()
    engine.shutdown()
    assert time.monotonic() - started < 10  # the ended engine core made the start fail at once
    assert not os.path.exists(f"/proc/{pid}")


@pytest.mark.engine
def test_a_launch_returns_once_the_start_adds_nothing_more_to_the_environment(model_path, monkeypatch):
    # glibc's setenv of a new name may move the environment's array under another thread's getenv
    # (a tokenizer's, at every batch it encodes: a segfault). A launch returns to work that may run
    # beside the rest of the start (the warm start), so every name the start adds comes before.
    added: list[tuple[str, bool]] = []  # (name, whether the launch had returned)
    launched = False
    real_putenv = os.putenv

    def recording_putenv(key: bytes, value: bytes) -> None:
        if key not in os.environ._data:  # os.environ's own bytes dict: a name the process lacks
            added.append((key.decode(), launched))
        real_putenv(key, value)

    monkeypatch.setattr(os, "putenv", recording_putenv)
    engine = VLLMEngine(model_path, EngineSettings(dtype="float32", max_model_len=256, kv_cache_gib=SMALL_KV_CACHE_GIB))
    try:
        before = set(multiprocessing.active_children())
        engine.launch()
        launched = True
        assert [process.name for process in multiprocessing.active_children() if process not in before] == [
            "EngineCore"
        ]
        engine.wait_until_serving()
    finally:
        engine.shutdown()
    assert (UNNAMED_LOCKS_VARIABLE, False) in added  # one of the engine core's own, added by the start
    assert [name for name, after_launch in added if after_launch] == []
