"""Waiting until a condition holds, and checking that one keeps holding, by polling."""

import time


def wait_for(predicate, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


def holds_for(predicate, duration_s: float = 0.3) -> bool:
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(0.01)
    return True
