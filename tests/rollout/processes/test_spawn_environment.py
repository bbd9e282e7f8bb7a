"""The engine's environment block: a process forked inside it can still take a title of its own, and a
block for a spawned process leaves this process's title memory alone."""

import os
import subprocess
import sys

import pytest

# A new interpreter whose environment begins with TMPDIR (which the block replaces) forks a child
# inside the block, and the child titles itself as vLLM's engine core does (with a title of its
# own: the suite's engine watch takes a process titled as the engine core for one). It prints the
# child's title, then whether the parent's command line still has its arguments apart.
TITLES = """
import os, sys, setproctitle
from lit_asyncrl.rollout.processes.spawn_environment import START_METHOD_VARIABLE, spawned_process_environment

with spawned_process_environment({"TMPDIR": os.environ["TMPDIR"] + "/run", START_METHOD_VARIABLE: sys.argv[1]}):
    pid = os.fork()
    if pid == 0:
        setproctitle.setproctitle("forked-in-the-block")
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as cmdline:
            os.write(1, cmdline.read().split(b"\\0")[0])
        os._exit(0)
    os.waitpid(pid, 0)
with open(f"/proc/{os.getpid()}/cmdline", "rb") as cmdline:
    print(" parent arguments apart:", cmdline.read().count(b"\\0") > 1)
"""


@pytest.mark.parametrize(
    ("start_method", "expected"),
    [
        # A fork: the title machinery is set up before TMPDIR is replaced, so the child takes its title.
        ("fork", b"forked-in-the-block parent arguments apart: False\n"),
        # A spawn: nothing set up in this process (its command line keeps its arguments apart); a forked
        # child then keeps the parent's title, which a spawned engine core never is.
        ("spawn", f"{sys.executable} parent arguments apart: True\n".encode()),
    ],
)
def test_only_a_block_for_a_fork_sets_up_the_title_and_then_the_child_takes_its_own(tmp_path, start_method, expected):
    environment = {"TMPDIR": str(tmp_path), "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}
    result = subprocess.run(
        [sys.executable, "-c", TITLES, start_method], env=environment, capture_output=True, check=True, timeout=60
    )
    assert result.stdout == expected
