"""The leftover check of the cleanup tests: a new entry counts only while no live process holds it.

Each test checks only the entries it made: the other worker's tests make and remove theirs meanwhile."""

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support.leftovers import left_behind, listing, resource_trackers


def test_a_new_entry_is_left_behind_once_no_process_holds_it():
    before = listing()
    handle, name = tempfile.mkstemp(prefix="leftover_check_", dir="/tmp")
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
    path = Path(tempfile.mkdtemp(prefix="leftover_check_", dir="/tmp")) / "s"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        assert str(path.parent) not in left_behind(before)  # bound: listed in /proc/net/unix
    finally:
        server.close()
    assert str(path.parent) in left_behind(before)  # the socket file stays, unbound
    path.unlink()
    path.parent.rmdir()
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
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
