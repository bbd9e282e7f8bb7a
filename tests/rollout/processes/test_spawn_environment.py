"""The engine's environment block: a process forked inside it can still take a title of its own."""

import os
import subprocess
import sys

# A new interpreter whose environment begins with TMPDIR (which the block replaces) forks a child
# inside the block, and the child titles itself as vLLM's engine core does (with a title of its
# own: the suite's engine watch takes a process titled as the engine core for one).
CHILD_TITLE = """
import os, setproctitle
from lit_asyncrl.rollout.processes.spawn_environment import spawned_process_environment

with spawned_process_environment({"TMPDIR": os.environ["TMPDIR"] + "/run"}):
    pid = os.fork()
    if pid == 0:
        setproctitle.setproctitle("forked-in-the-block")
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as cmdline:
            os.write(1, cmdline.read().split(b"\\0")[0])
        os._exit(0)
    os.waitpid(pid, 0)
"""


def test_a_process_forked_in_the_block_takes_its_title_when_the_environment_begins_with_what_it_replaces(
    tmp_path,
):
    environment = {"TMPDIR": str(tmp_path), "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")}
    result = subprocess.run(
        [sys.executable, "-c", CHILD_TITLE], env=environment, capture_output=True, check=True, timeout=60
    )
    assert result.stdout == b"forked-in-the-block"
