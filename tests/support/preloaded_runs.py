"""Runs of an entry point forked from this test worker's preloaded interpreter (`preloaded_server.py`).

`run_preloaded(module, args)` is `subprocess.run([sys.executable, "-m", module, *args])` with the
run's imports already done: the same exit code (negative: the signal that ended it), stdout and
stderr. The server is started at the worker's first such run and ends with the worker.
Tests of what a new interpreter prints (the console a user sees) start one instead (`run_command`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.preloaded_server import MESSAGE_BYTES

REPO = Path(__file__).resolve().parents[2]


class PreloadedInterpreter:
    """The server process and this worker's end of its socket."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.preloaded_server", str(theirs.fileno())],
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        theirs.close()
        self.connection = ours
        self._receive(timeout_s=300)  # {"ready": true}, once the imports are done

    def _receive(self, timeout_s: float) -> dict:
        self.connection.settimeout(timeout_s)
        message = self.connection.recv(MESSAGE_BYTES)
        if not message:
            raise RuntimeError(f"the preloaded interpreter ended (exit code {self.process.wait()})")
        return json.loads(message)

    def run(self, module: str, args: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess:
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            request = {"module": module, "args": args, "env": env, "cwd": str(REPO)}
            socket.send_fds(self.connection, [json.dumps(request).encode()], [stdout.fileno(), stderr.fileno()])
            pid = self._receive(timeout_s=60)["pid"]
            try:
                ended = self._receive(timeout_s=timeout_s)
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self._receive(timeout_s=60)
                raise subprocess.TimeoutExpired([module, *args], timeout_s) from None
            assert ended["ended"] == pid
            outputs = []
            for stream in (stdout, stderr):
                stream.seek(0)
                outputs.append(stream.read().decode(errors="replace"))
        return subprocess.CompletedProcess(
            [sys.executable, "-m", module, *args], os.waitstatus_to_exitcode(ended["status"]), *outputs
        )


_SERVER: PreloadedInterpreter | None = None


def run_preloaded(
    module: str, args: list[str], timeout_s: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m module args` with PYTHONUNBUFFERED=1 and `env` over this worker's environment,
    forked from this worker's preloaded interpreter."""
    global _SERVER
    if _SERVER is None or _SERVER.process.poll() is not None:
        _SERVER = PreloadedInterpreter()
    return _SERVER.run(module, args, {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, timeout_s)
