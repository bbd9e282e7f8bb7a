"""The leftover check of the cleanup tests: a new entry counts only while no live process holds it."""

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.leftovers import left_behind, listing


def test_a_new_entry_is_left_behind_once_no_process_holds_it():
    before = listing()
    handle, name = tempfile.mkstemp(prefix="leftover_check_", dir="/tmp")
    os.close(handle)
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sys, time; f = open({name!r}); print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE
    )
    try:
        holder.stdout.readline()  # the file is open in the holder
        assert left_behind(before) == []
    finally:
        holder.kill()
        holder.wait()
    try:
        assert left_behind(before) == [name]  # nobody holds it now
    finally:
        os.unlink(name)
    assert left_behind(before) == []


def test_a_socket_counts_while_bound_and_a_dir_while_its_owner_lives():
    before = listing()
    path = Path(tempfile.mkdtemp(prefix="leftover_check_", dir="/tmp")) / "s"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        assert left_behind(before) == []  # bound: listed in /proc/net/unix
    finally:
        server.close()
    assert left_behind(before) == [str(path.parent)]  # the socket file stays, unbound
    path.unlink()
    path.parent.rmdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    ours = Path(tempfile.mkdtemp(prefix=f"lit_asyncrl_run_{os.getpid()}_", dir="/tmp"))
    theirs = Path(tempfile.mkdtemp(prefix=f"lit_asyncrl_run_{gone}_", dir="/tmp"))
    try:
        assert left_behind(before) == [str(theirs)]  # our own pid is alive; the other one is gone
    finally:
        ours.rmdir()
        theirs.rmdir()
