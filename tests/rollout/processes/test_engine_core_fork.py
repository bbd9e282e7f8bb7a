"""The forked engine core's settling (`rollout/processes/core_fork.py`), in real forked processes named as vLLM names them."""

import ctypes
import gc
import json
import multiprocessing
import os
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

from lit_asyncrl.rollout.processes.core_fork import FORKED_VARIABLE, forked_engine_core_environment

_traced_graphs = []


def _recording_backend(graph, example_inputs):
    _traced_graphs.append(graph)
    return graph


# Decorated as vLLM's sampler kernels are: when the parent imports them, before any engine exists.
_compiled = torch.compile(lambda x: x * 2 + 1, backend=_recording_backend)


def _compiled_runs_eagerly() -> bool:
    """Whether the compiled function runs without being traced."""
    _compiled(torch.ones(3))
    return not _traced_graphs


def _child(report: str, parent_frozen: int) -> None:
    # multiprocessing has run the after-fork hooks by now, as it does before vLLM's engine core runs.
    library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.warn("deprecated", FutureWarning, stacklevel=1)
    seen = [
        torch.get_num_threads(),
        _compiled_runs_eagerly(),
        tempfile.gettempdir(),
        len(caught),
        ctypes.c_int.in_dll(library, "FLAGS_caffe2_log_level").value,
    ]
    # The parent's objects frozen here (beyond what the parent had frozen itself, as a pytest worker
    # does after collection), and kept so through vLLM's unfreeze at shutdown.
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    seen += [frozen > parent_frozen, frozen > 0 and gc.get_freeze_count() == frozen]
    Path(report).write_text(json.dumps(seen))


def _run_forked(tmp_path: Path, monkeypatch, name: str, environment: dict[str, str]) -> list:
    """What a child forked with `environment` and named `name` reports of its own state."""
    report = tmp_path / "report"
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the trainer's pool, which the child must not keep
    try:
        process = multiprocessing.get_context("fork").Process(
            target=_child, args=(str(report), gc.get_freeze_count()), name=name
        )
        process.start()
        process.join(60)
    finally:
        torch.set_num_threads(threads)
    assert process.exitcode == 0
    return json.loads(report.read_text())


@pytest.fixture
def engine_core_environment(tmp_path):
    """What `engine_config.engine_core_environment` holds while an in-process CPU engine core is forked."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return {
        "OMP_NUM_THREADS": "1",
        "TORCHDYNAMO_DISABLE": "1",
        "TMPDIR": str(run_dir),
        **forked_engine_core_environment(quiet=True),
    }


def test_a_forked_engine_core_takes_its_environment_as_a_spawned_one_would(
    tmp_path, monkeypatch, engine_core_environment
):
    # One torch thread, no torch.compile, the run's temp dir, FutureWarnings and C++ warnings quiet
    # (ERROR = 2), the parent's heap frozen for good.
    assert _run_forked(tmp_path, monkeypatch, "EngineCore_DP0", engine_core_environment) == [
        1,
        True,
        str(tmp_path / "run"),
        0,
        2,
        True,
        True,
    ]


def test_a_loud_engine_core_keeps_its_warnings(tmp_path, monkeypatch, engine_core_environment):
    loud = {**engine_core_environment, **forked_engine_core_environment(quiet=False)}
    library = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
    own_log_level = ctypes.c_int.in_dll(library, "FLAGS_caffe2_log_level").value
    threads, _, _, warned, log_level, *_ = _run_forked(tmp_path, monkeypatch, "EngineCore_DP0", loud)
    assert (threads, warned, log_level) == (1, 1, own_log_level)


def test_other_forked_processes_are_left_as_they_are(tmp_path, monkeypatch, engine_core_environment):
    # A process of another name (a DataLoader worker, vLLM's own workers), or one forked without
    # the variable, keeps the parent's state.
    worker = _run_forked(tmp_path, monkeypatch, "Worker", engine_core_environment)
    assert (worker[0], worker[-2]) == (2, False)  # the parent's threads, nothing frozen
    unarmed = {key: value for key, value in engine_core_environment.items() if key != FORKED_VARIABLE}
    monkeypatch.delenv(FORKED_VARIABLE)
    assert _run_forked(tmp_path, monkeypatch, "EngineCore_DP0", unarmed)[:2] == [2, False]


def _hold(seconds: float) -> None:
    import time

    time.sleep(seconds)


def test_a_forked_engine_core_does_not_hold_another_threads_process_start(monkeypatch, engine_core_environment):
    # A pipe this process holds both ends of, as `subprocess.Popen` does while its child has not yet
    # exec'd: its read returns (EOF) once every copy of the write end is closed. A forked child that
    # kept its copy would hold the read for as long as it lives.
    import select

    for key, value in engine_core_environment.items():
        monkeypatch.setenv(key, value)
    processes = {
        name: multiprocessing.get_context("fork").Process(target=_hold, args=(30,), name=name)
        for name in ("EngineCore_DP0", "Worker")
    }
    read_end, write_end = os.pipe()
    try:
        processes["EngineCore_DP0"].start()
        os.close(write_end)
        assert select.select([read_end], [], [], 20)[0] == [read_end] and os.read(read_end, 1) == b""
        os.close(read_end)
        # A process of another name keeps what it inherited, as any forked process does.
        read_end, write_end = os.pipe()
        processes["Worker"].start()
        os.close(write_end)
        # It inherited the write end at its fork and keeps it for its 30 s: half a second shows it
        # (a process closing what it inherited does so as it starts).
        assert select.select([read_end], [], [], 0.5)[0] == []
    finally:
        for process in processes.values():
            if process.pid is not None:
                process.kill()
                process.join(10)
        os.close(read_end)
