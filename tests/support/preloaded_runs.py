"""Runs of an entry point forked from this test worker's preloaded interpreter (`preloaded_server.py`).

`run_preloaded(module, args)` is `subprocess.run([sys.executable, "-m", module, *args])` with the
run's imports already done: the same exit code (negative: the signal that ended it), stdout and
stderr. `PreloadedProcess` is the `subprocess.Popen` of such a run (stdout and stderr on one pipe),
for tests that watch, signal or kill it. The server is started at the worker's first such run and
ends with the worker.
Tests of what a new interpreter prints (the console a user sees) start one instead (`run_command`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
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
        self._wait_statuses: dict[int, int] = {}  # of runs that ended, until asked for
        self._lock = threading.Lock()  # a test's reader thread and its main thread both ask
        if self._message(timeout_s=300) is None:  # {"ready": true}, once the imports are done
            raise RuntimeError("the preloaded interpreter did not finish its imports within 300 s")

    def _message(self, timeout_s: float) -> dict | None:
        """The server's next message, or None if none came within `timeout_s`."""
        readable, _, _ = select.select([self.connection], [], [], max(timeout_s, 0.0))
        if not readable:
            return None
        message = self.connection.recv(MESSAGE_BYTES)
        if not message:
            raise RuntimeError(f"the preloaded interpreter ended (exit code {self.process.wait()})")
        return json.loads(message)

    def start(self, module: str, args: list[str], env: dict[str, str], stdout: int, stderr: int) -> int:
        """Fork a run of `module` with output on the descriptors `stdout` and `stderr`; returns its pid."""
        request = {"module": module, "args": args, "env": env, "cwd": str(REPO)}
        with self._lock:
            socket.send_fds(self.connection, [json.dumps(request).encode()], [stdout, stderr])
            while True:
                message = self._message(timeout_s=60)
                if message is None:
                    raise RuntimeError("the preloaded interpreter did not answer a request within 60 s")
                if "pid" in message:
                    return message["pid"]
                self._wait_statuses[message["ended"]] = message["status"]

    def wait_status(self, pid: int, timeout_s: float) -> int | None:
        """Run `pid`'s wait status once it ended, waiting up to `timeout_s` (0: a look); None if still running."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while pid not in self._wait_statuses:
                message = self._message(deadline - time.monotonic())
                if message is None:
                    return None
                self._wait_statuses[message["ended"]] = message["status"]
            return self._wait_statuses.pop(pid)


_SERVER: PreloadedInterpreter | None = None


def preloaded_interpreter() -> PreloadedInterpreter:
    """This worker's preloaded interpreter, started at the first call."""
    global _SERVER
    if _SERVER is None or _SERVER.process.poll() is not None:
        _SERVER = PreloadedInterpreter()
    return _SERVER


def run_environment(env: dict[str, str] | None) -> dict[str, str]:
    """This worker's environment with PYTHONUNBUFFERED=1 and `env` over it."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}


class PreloadedProcess:
    """A forked run as `subprocess.Popen(..., stdout=PIPE, stderr=STDOUT, text=True)` gives it: `pid`,
    `stdout`, `returncode`, `poll`, `wait`, `communicate`, `send_signal`, `kill`."""

    def __init__(self, module: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args = [sys.executable, "-m", module, *args]
        self._server = preloaded_interpreter()
        read_end, write_end = os.pipe()
        try:
            self.pid = self._server.start(module, args, run_environment(env), write_end, write_end)
        finally:
            os.close(write_end)
        self.stdout = open(read_end, errors="replace")  # noqa: SIM115 (closed by communicate, as Popen's)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.wait(timeout=0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            status = self._server.wait_status(self.pid, 1e9 if timeout is None else timeout)
            if status is None:
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, None]:
        """Its whole output (to the end of the pipe, which its orphans may hold) and its end."""
        deadline = None if timeout is None else time.monotonic() + timeout
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.append(self.stdout.read()), daemon=True)
        reader.start()
        reader.join(timeout)
        if reader.is_alive():
            raise subprocess.TimeoutExpired(self.args, timeout)
        self.stdout.close()
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0.001))
        return "".join(chunks), None

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run_preloaded(
    module: str, args: list[str], timeout_s: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m module args` with PYTHONUNBUFFERED=1 and `env` over this worker's environment,
    forked from this worker's preloaded interpreter."""
    server = preloaded_interpreter()
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        pid = server.start(module, args, run_environment(env), stdout.fileno(), stderr.fileno())
        status = server.wait_status(pid, timeout_s)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            server.wait_status(pid, 60)
            raise subprocess.TimeoutExpired([module, *args], timeout_s)
        outputs = []
        for stream in (stdout, stderr):
            stream.seek(0)
            outputs.append(stream.read().decode(errors="replace"))
    return subprocess.CompletedProcess(
        [sys.executable, "-m", module, *args], os.waitstatus_to_exitcode(status), *outputs
    )
