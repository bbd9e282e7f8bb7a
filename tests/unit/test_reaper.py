"""Temp dirs of killed runs, and the reaper that kills a SIGKILLed trainer's processes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lit_asyncrl.rollout import engine as engine_module
from lit_asyncrl.rollout.engine import WEIGHTS_DIR_PREFIX, _remove_temp_dirs_of_dead_runs


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_only_the_dirs_of_dead_owners_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_module, "_shared_memory_dir", lambda: str(tmp_path))
    dead = tmp_path / f"{WEIGHTS_DIR_PREFIX}{dead_pid()}_abc"
    live = tmp_path / f"{WEIGHTS_DIR_PREFIX}{os.getpid()}_def"
    unrelated = tmp_path / "lit_asyncrl_something_else"
    for path in (dead, live, unrelated):
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"x")
    _remove_temp_dirs_of_dead_runs()
    assert not dead.exists() and live.exists() and unrelated.exists()


def test_the_reaper_kills_what_a_killed_trainer_started_and_removes_its_paths(tmp_path):
    # A stand-in trainer: starts a reaper for a path, then a long-running child, then waits.
    marker = tmp_path / "weights"
    marker.mkdir()
    trainer_code = f"""
import subprocess, sys, time
from lit_asyncrl.rollout.reaper import start_reaper
start_reaper([{str(marker)!r}])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""
    trainer = subprocess.Popen([sys.executable, "-c", trainer_code], stdout=subprocess.PIPE, text=True)
    child_pid = int(trainer.stdout.readline())
    time.sleep(1.5)  # the reaper has recorded the child (it polls every 0.5 s)
    os.kill(trainer.pid, signal.SIGKILL)
    trainer.wait()
    deadline = time.monotonic() + 10
    while (Path(f"/proc/{child_pid}").exists() or marker.exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    state = Path(f"/proc/{child_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{child_pid}").exists() else "gone"
    assert state in ("gone", "Z")  # killed (a zombie until init reaps it)
    assert not marker.exists()
