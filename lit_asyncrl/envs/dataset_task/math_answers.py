"""Math answers checked with `math-verify`, in a process of their own.

`math-verify` bounds its parsing and verification time with `signal.alarm`, which Python allows only
on a process's main thread; a task's steps run on the engine's event loop or in a thread pool, so
the checks go to one worker process, on whose main thread the alarm works. A check that outlives its
own alarms and a margin counts as wrong, and the worker is replaced.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from multiprocessing.connection import Connection

#: Seconds math-verify may spend on one parse or one verification (its own alarm, in the worker).
CHECK_TIMEOUT_S = 5


def verify_answer(gold: str, completion: str) -> bool:
    """Whether `completion` states the same mathematical answer as `gold` (a bare answer is read as math)."""
    from math_verify import parse, verify

    expected = parse(gold if "$" in gold or "\\" in gold else f"${gold}$")
    stated = parse(completion)
    return bool(expected) and bool(stated) and verify(expected, stated)


def _serve(connection: Connection) -> None:
    """The worker: answers each (gold, completion) with a bool until its parent closes the pipe."""
    # math-verify 0.3.3 asks latex2sympy2_extended for `equations=True`, which newer versions of that
    # package warn about at every answer: a line per check on the run's console, about nothing the user can change.
    logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)
    while True:
        try:
            gold, completion = connection.recv()
        except EOFError:  # the parent is gone or closed the pipe
            return
        try:
            connection.send(verify_answer(gold, completion))
        except Exception:  # an answer math-verify cannot read is a wrong answer
            connection.send(False)


class MathVerifier:
    """Checks answers in one worker process, started on first use and stopped by `close`.

    Checks from several threads take turns (one worker, one pipe).
    """

    def __init__(self, timeout_s: float = 3 * CHECK_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._connection: Connection | None = None

    def check(self, gold: str, completion: str) -> bool:
        with self._lock:
            connection = self._started()
            connection.send((str(gold), str(completion)))
            if connection.poll(self.timeout_s):
                return connection.recv()
            self._stop()  # stuck past its own alarms: the next check starts a new worker
            return False

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _started(self) -> Connection:
        if self._process is None or not self._process.is_alive():
            self._stop()
            ours, theirs = multiprocessing.get_context("spawn").Pipe()
            self._process = multiprocessing.get_context("spawn").Process(
                target=_serve, args=(theirs,), name="math-verify", daemon=True
            )
            self._process.start()
            theirs.close()
            self._connection = ours
        return self._connection

    def _stop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._process is not None:
            self._process.kill()
            self._process.join()
            self._process = None
