"""The leftover check of the cleanup tests and of the test session: a new entry counts only while no
live process holds it, anywhere in the session's own temp dir, and in /tmp or /dev/shm only under a
name a run of ours can make.

Each test checks only the entries it made: the other worker's tests make and remove theirs meanwhile."""

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.support.leftovers import left_behind, listing, resource_trackers, session_temp_dir
from tests.support.runs import REPO


def test_a_new_entry_is_left_behind_once_no_process_holds_it():
    before = listing()
    handle, name = tempfile.mkstemp(prefix="leftover_check_", dir=session_temp_dir())
    os.close(handle)
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sys, time; f = open({name!r}); print(flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    try:
        holder.stdout.readline()  # the file is open in the holder
        assert name not in left_behind(before)
    finally:
        holder.kill()
        holder.wait()
    try:
        assert name in left_behind(before)  # nobody holds it now
    finally:
        os.unlink(name)
    assert name not in left_behind(before)


def test_a_socket_counts_while_bound_and_a_dir_while_its_owner_lives():
    before = listing()
    path = Path(tempfile.mkdtemp(prefix="leftover_check_", dir=session_temp_dir())) / "s"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        assert str(path.parent) not in left_behind(before)  # bound: listed in /proc/net/unix
    finally:
        server.close()
    assert str(path.parent) in left_behind(before)  # the socket file stays, unbound
    path.unlink()
    path.parent.rmdir()
    gone = _a_pid_no_process_has()
    ours = Path(tempfile.mkdtemp(prefix=f"lit_asyncrl_run_{os.getpid()}_", dir="/tmp"))
    theirs = Path(tempfile.mkdtemp(prefix=f"lit_asyncrl_run_{gone}_", dir="/tmp"))
    try:
        left = left_behind(before)
        assert str(theirs) in left and str(ours) not in left  # our own pid is alive; the other one is gone
    finally:
        ours.rmdir()
        theirs.rmdir()


def test_a_semaphore_waits_for_a_live_resource_tracker_outside_the_run(tmp_path):
    # A run's own processes are gone; a semaphore nobody maps counts as that run's leftover, except
    # while another process's resource tracker lives, which may still unlink it.
    before = listing()
    semaphore = Path("/dev/shm") / f"sem.mp-leftover-check-{os.getpid()}"
    semaphore.write_bytes(b"")
    tracker_code = "from multiprocessing import resource_tracker as t; t.ensure_running(); print(t._resource_tracker._pid, flush=True); input()"
    holder = subprocess.Popen(
        [sys.executable, "-c", tracker_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        foreign = int(holder.stdout.readline())  # the holder's tracker runs
        # Every other live tracker stands for the run's own processes here.
        assert str(semaphore) not in left_behind(before, set(resource_trackers()) - {foreign})
        assert str(semaphore) in left_behind(before)  # without a run's processes: always counted
        holder.communicate("\n", timeout=10)  # the holder ends; its tracker ends with it
        deadline = time.monotonic() + 10
        while foreign in resource_trackers() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert str(semaphore) in left_behind(before, set(resource_trackers()))
    finally:
        holder.kill()
        semaphore.unlink()


def test_in_the_shared_roots_only_names_a_run_of_ours_can_make_count():
    before = listing()
    unrelated = [
        Path(tempfile.mkdtemp(prefix="an_editors_swap_", dir="/tmp")),
        Path(tempfile.mkdtemp(prefix="tmp", dir="/tmp")),
    ]
    ours = [
        Path(tempfile.mkdtemp(prefix=f"lit_asyncrl_weights_{_a_pid_no_process_has()}_", dir="/tmp")),
        Path("/tmp") / str(uuid.uuid4()),  # vLLM's ZMQ socket where VLLM_RPC_BASE_PATH was not set
        Path("/dev/shm") / f"sem.mp-leftover-check-{os.getpid()}",
        Path(tempfile.mkdtemp(prefix="in_the_session_temp_dir_", dir=session_temp_dir())),
    ]
    ours[1].write_bytes(b"")
    ours[2].write_bytes(b"")
    try:
        left = set(left_behind(before))  # the other worker's tests may leave theirs meanwhile
        assert {str(path) for path in ours} <= left and not {str(path) for path in unrelated} & left
    finally:
        for path in unrelated + [ours[0], ours[3]]:
            path.rmdir()
        ours[1].unlink()
        ours[2].unlink()


def test_a_session_passes_beside_another_programs_file_and_fails_on_one_of_its_own(tmp_path):
    # A test session of its own (this suite's conftest, one worker): its test leaves an unrelated dir
    # in /tmp, then a file in the session's temp dir (where `tempfile` points every test process).
    unrelated = Path("/tmp") / f"another_programs_dir_{os.getpid()}"
    (tmp_path / "test_inner.py").write_text(
        "import os, tempfile\n"
        "def test_beside_another_program():\n"
        f"    os.mkdir({str(unrelated)!r})\n"
        "def test_leaving_a_file_of_its_own():\n"
        "    if os.environ.get('LEAVE_ONE'):\n"
        "        os.close(tempfile.mkstemp(prefix='left_by_the_run_')[0])\n"
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", str(tmp_path)]
    try:
        clean = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert clean.returncode == 0, clean.stdout[-2000:]
        unrelated.rmdir()
        leaving = subprocess.run(
            command, cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "LEAVE_ONE": "1"}
        )
    finally:
        if unrelated.exists():
            unrelated.rmdir()
    assert leaving.returncode == 1, leaving.stdout[-2000:]
    assert "2 passed" in leaving.stdout
    assert "the test session left 1 entries in its temp dir, /tmp or /dev/shm" in leaving.stdout
    assert "left_by_the_run_" in leaving.stdout


def _a_pid_no_process_has() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
