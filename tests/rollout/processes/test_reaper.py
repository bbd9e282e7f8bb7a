"""Temp dirs of killed runs, and the reaper that kills a SIGKILLed trainer's processes."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from lit_asyncrl.rollout.processes import temp_dirs
from lit_asyncrl.rollout.processes.temp_dirs import (
    RUN_DIR_PREFIX,
    WEIGHTS_DIR_PREFIX,
    remove_dirs_of,
    remove_dirs_of_dead_owners,
)


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_only_the_dirs_of_dead_owners_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(temp_dirs, "_root", lambda: str(tmp_path))
    gone = dead_pid()
    dead = [tmp_path / f"{WEIGHTS_DIR_PREFIX}{gone}_abc", tmp_path / f"{RUN_DIR_PREFIX}{gone}_ghi"]
    live = [tmp_path / f"{WEIGHTS_DIR_PREFIX}{os.getpid()}_def", tmp_path / f"{RUN_DIR_PREFIX}{os.getpid()}_jkl"]
    unrelated = tmp_path / "lit_asyncrl_something_else"
    for path in (*dead, *live, unrelated):
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"x")
    remove_dirs_of_dead_owners()
    assert [path.exists() for path in (*dead, *live, unrelated)] == [False, False, True, True, True]


def test_only_the_dirs_of_the_named_owners_are_removed(tmp_path, monkeypatch):
    # What a reaper does for the processes it killed: their own dirs go, anyone else's stay.
    monkeypatch.setattr(temp_dirs, "_root", lambda: str(tmp_path))
    killed, other = 4_000_001, 4_000_002
    paths = [
        tmp_path / f"{WEIGHTS_DIR_PREFIX}{killed}_a",
        tmp_path / f"{RUN_DIR_PREFIX}{killed}_b",
        tmp_path / f"{WEIGHTS_DIR_PREFIX}{other}_c",
    ]
    for path in paths:
        path.mkdir()
    remove_dirs_of({killed})
    assert [path.exists() for path in paths] == [False, False, True]


def test_the_reapers_of_sigkilled_trainers_kill_what_they_started_and_remove_their_paths(tmp_path):
    """Three stand-in trainers, SIGKILLed together once their reapers have polled (one wait for all three):

    - one starts a reaper for a path, then a long-running child: the child is killed, the path removed;
    - one has four reapers, as a trainer has one for its run dir and one per engine. Each records the
      trainer's children, the other reapers among them: the first to see the trainer gone must not
      kill the others before they removed their paths (a reaper that killed the rest would leave three);
    - one holds a spawn-context lock, a named semaphore in /dev/shm (sem.mp-*) that multiprocessing's
      resource tracker unlinks once the processes holding its pipe are gone: the reaper spares the tracker.
    """
    marker = tmp_path / "weights"
    marker.mkdir()
    with_child = f"""
import subprocess, sys, time
from lit_asyncrl.rollout.processes.reaper import start_reaper
start_reaper([{str(marker)!r}])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""
    paths = [tmp_path / f"engine_{index}" for index in range(4)]
    for path in paths:
        path.mkdir()
    with_four_reapers = f"""
import time
from lit_asyncrl.rollout.processes.reaper import start_reaper
for path in {[str(path) for path in paths]!r}:
    start_reaper([path])
print("ready", flush=True)
time.sleep(600)
"""
    script = tmp_path / "trainer_with_lock.py"
    script.write_text(
        """
import multiprocessing, os, sys, time
from lit_asyncrl.rollout.processes.reaper import start_reaper
if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    lock = context.Lock()
    start_reaper([])
    child = context.Process(target=time.sleep, args=(600,))
    child.start()
    print(lock._semlock.name, flush=True)
    time.sleep(600)
"""
    )
    trainers = [
        subprocess.Popen([sys.executable, "-c", with_child], stdout=subprocess.PIPE, text=True),
        subprocess.Popen([sys.executable, "-c", with_four_reapers], stdout=subprocess.PIPE, text=True),
        subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True),
    ]
    child_pid = int(trainers[0].stdout.readline())
    assert trainers[1].stdout.readline().strip() == "ready"
    semaphore = Path("/dev/shm") / f"sem.{trainers[2].stdout.readline().strip().lstrip('/')}"
    assert semaphore.exists()
    time.sleep(1.5)  # every reaper has recorded its trainer's children (they poll every 0.5 s)
    for trainer in trainers:
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        Path(f"/proc/{child_pid}").exists()
        or marker.exists()
        or any(path.exists() for path in paths)
        or semaphore.exists()
    ):
        time.sleep(0.1)
    state = (
        Path(f"/proc/{child_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if Path(f"/proc/{child_pid}").exists()
        else "gone"
    )
    assert state in ("gone", "Z")  # killed (a zombie until init reaps it)
    assert not marker.exists()
    assert [path.name for path in paths if path.exists()] == []
    assert not semaphore.exists()


def test_a_run_dir_takes_vllms_ipc_paths_and_the_temp_dir_and_goes_at_exit():
    code = """
import multiprocessing.util, os, tempfile  # loaded before the run dir is made, as torch and vLLM load it
from lit_asyncrl.rollout.processes.temp_dirs import engine_environment, run_dir
made = run_dir()
assert run_dir() == made  # one per process
environment = engine_environment()
shared = multiprocessing.util.get_temp_dir()  # made in the run dir, removed by multiprocessing at exit
print(made, tempfile.gettempdir(), environment["VLLM_RPC_BASE_PATH"], environment["TMPDIR"], os.path.dirname(shared), flush=True)
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ}
    )
    made, *pointed = result.stdout.split()
    assert Path(made).name.startswith("lit_asyncrl_run_")
    assert pointed == [made, made, made, made]
    assert not Path(made).exists()  # removed when the process exited
    assert result.stderr == ""  # after multiprocessing's own dir in it: no traceback from its removal


def test_a_process_killed_after_its_shutdown_removes_its_run_dir_first():
    # A Ray actor is killed without its exit handlers once its engine is shut down: it removes its
    # run dir itself, and `tempfile` points back to the temp dir it had.
    code = """
import os, tempfile
from lit_asyncrl.rollout.processes.temp_dirs import remove_run_dir, run_dir
original = tempfile.gettempdir()
made = run_dir()
remove_run_dir()
print(made, os.path.exists(made), tempfile.gettempdir() == original, flush=True)
os._exit(0)  # no exit handlers, as under ray.kill
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    made, exists, restored = result.stdout.split()
    assert (exists, restored) == ("False", "True")
    assert not Path(made).exists()
