"""A Python process that has imported what a run imports, and forks a run for each request.

A test's run in a new interpreter spends most of its own CPU importing torch, Lightning,
transformers and vLLM (measured: 11-12 CPU-s of the 13-17 s a short run's trainer uses on a
2-core machine). Forked from this process, the run starts with those modules loaded and then runs
its entry point exactly as `python -m <module> <args>` does (`runpy`, `__main__` and `sys.argv`
as the interpreter sets them, so that Lightning's DDP launcher and multiprocessing's spawn start
their processes as they would), with the request's environment, working dir and output files.

Run as `python -m tests.support.preloaded_server FD`: FD is a unix seqpacket socket to the test
worker (`tests/support/preloaded_runs.py`). Each request is a JSON message with two file
descriptors (stdout, stderr); the reply gives the run's pid, and a later message its wait status.
The server ends when the worker closes its end (the worker exited, however it ended).
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import tempfile
import threading

#: What a run imports first, in the order the entry point imports it (`lit_asyncrl.train` sets the
#: process's OpenMP policy before torch loads OpenMP), then what its main function imports.
PRELOADED = (
    "lit_asyncrl.train",
    "torch",
    "lightning",
    "transformers",
    "vllm.v1.engine.async_llm",
    "lit_asyncrl.before_fit",
    "lit_asyncrl.datamodule",
    "lit_asyncrl.module",
    "lit_asyncrl.cli",
)
#: A request's reply and exit messages are small; a request carries a whole environment.
MESSAGE_BYTES = 1 << 20


def preload() -> dict[str, str]:
    """Import `PRELOADED`; returns the environment variables the imports set or changed."""
    before = dict(os.environ)
    # What the imports make lives as long as the process: the collector's walks over it while they
    # run find nothing to free (10 full collections, 1.5 s, measured), and in a forked run each
    # walk would also write to every inherited object, copying the pages it shares with this
    # process. Frozen after the imports, a run's collections leave it out (a short run made two
    # full collections of ~0.5 s each over it).
    gc.disable()
    for name in PRELOADED:
        importlib.import_module(name)
    gc.freeze()
    gc.enable()
    # A fork copies only the forking thread: a Python thread started by an import would be missing
    # in every run, holding whatever lock it held. (The imports also start native threads, torch's
    # and jemalloc's, whose libraries reset their state in a forked child, as in the engine core
    # the run itself forks.)
    if threading.active_count() != 1:
        raise RuntimeError(f"the preloaded imports started threads: {threading.enumerate()}")
    # vLLM names its engine process with setproctitle, which finds the memory it writes the name to
    # through the environment on its first call: made here, before a run replaces the environment.
    importlib.import_module("setproctitle").getproctitle()
    return {key: value for key, value in os.environ.items() if before.get(key) != value}


def serve(connection: socket.socket) -> dict | None:
    """Fork a run for each request until the worker closes its end (then None). In a forked run,
    returns its request, with its output already on fds 1 and 2."""
    running: set[int] = set()
    while True:
        readable, _, _ = select.select([connection], [], [], 0.2)
        if readable:
            message, fds, _, _ = socket.recv_fds(connection, MESSAGE_BYTES, 2)
            if not message:
                return None
            pid = os.fork()
            if pid == 0:
                connection.close()
                devnull = os.open(os.devnull, os.O_RDONLY)
                for source, target in ((devnull, 0), (fds[0], 1), (fds[1], 2)):
                    os.dup2(source, target)
                    os.close(source)
                return json.loads(message)
            for fd in fds:
                os.close(fd)
            running.add(pid)
            connection.send(json.dumps({"pid": pid}).encode())
        for pid in list(running):
            ended, status = os.waitpid(pid, os.WNOHANG)
            if ended:
                running.discard(pid)
                connection.send(json.dumps({"ended": pid, "status": status}).encode())


def become_the_run(request: dict, set_by_imports: dict[str, str]) -> None:
    """This forked process takes the request's environment, working dir and arguments, and runs its
    module as `python -m` runs it; the process then ends as that interpreter would."""
    os.chdir(request["cwd"])
    environment = request["env"]
    os.environ.clear()
    os.environ.update(environment)
    # Then what the imports set, unless the request sets it too (a new interpreter's imports would
    # have set it over a value the worker's environment lacked, and kept one it had). After the
    # request's own, as a new interpreter's imports add theirs: a process this run starts inherits
    # that order, and vLLM's imports there set some of these again. Had one come first, the string
    # setproctitle finds the process's title memory by would be replaced before its first call, and
    # an engine core forked there would keep its parent's title (seen: Hydra's parallel launcher's jobs).
    os.environ.update({key: value for key, value in set_by_imports.items() if key not in environment})
    tempfile.tempdir = None  # read again from TMPDIR, as a new interpreter reads it
    # Ctrl-C as a user's terminal delivers it to a foreground run. (A shell that starts a job in the
    # background, as some CI runners do, starts it with SIGINT ignored, which a process inherits.)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = [request["module"], *request["args"]]
    # Its command line as `ps` and /proc show it, for the tests that find a run's processes by it.
    importlib.import_module("setproctitle").setproctitle(" ".join([sys.executable, "-m", *sys.argv]))
    # `python -m` runs the module as __main__ only (runpy warns if it is also imported under its name).
    sys.modules.pop(request["module"], None)
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def main() -> None:
    connection = socket.socket(fileno=int(sys.argv[1]))
    set_by_imports = preload()
    connection.send(b'{"ready": true}')
    request = serve(connection)
    if request is not None:
        become_the_run(request, set_by_imports)


if __name__ == "__main__":
    main()
