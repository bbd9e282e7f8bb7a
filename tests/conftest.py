"""Checks over the whole suite.

- The `engine` mark is on exactly the tests that use vLLM: a test that starts an engine process
  (in this process or in a run it launches) without the mark fails, and so does a marked test
  during which no engine process lived. So `-m "not engine"` is the fast part, and nothing in it
  waits for an engine.
- A whole test session leaves nothing behind: nothing in the temp dir it gives every process it
  starts, and nothing new in /tmp or /dev/shm under a name a run of ours can make (pytest's basetemp
  aside; `tests/support/leftovers.py`). Other programs' files there do not count.
"""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

import pytest

from lit_asyncrl.cache_dir import keep_torch_compile_cache_here
from tests.support.leftovers import left_behind, listing, start_session_temp_dir
from tests.support.libyaml_configs import parse_configs_with_libyaml

# The tiny policy's `model_path` and `tokenizer` fixtures, for every test folder.
pytest_plugins = ["tests.support.tiny_policy"]

# Test modules import lightning before lit_asyncrl, and importing lightning makes torch's compile
# cache dir (in /tmp unless told otherwise); lit_asyncrl's entry points set this themselves.
keep_torch_compile_cache_here()
# The suite composes the configs hundreds of times: YAML parsed in C (`tests/support/libyaml_configs.py`).
parse_configs_with_libyaml()

ENGINE_PROCESS = b"VLLM::EngineCore"


class EngineWatch:
    """Records when each vLLM engine-core process below this one was first seen (polled in a thread)."""

    POLL_S = 0.5

    def __init__(self) -> None:
        self.first_seen: dict[int, float] = {}
        self.alive_at: list[float] = []  # the polls that saw at least one engine process below us
        self.anywhere_at: list[float] = []  # the polls that saw one anywhere on the machine
        self.failed_at: dict[float, str] = {}  # the polls that failed: when, and the traceback
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="engine-watch", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.POLL_S):
            try:
                self._look()
            except Exception:  # a test the failed poll could have seen gets the cause, the watch goes on
                self.failed_at[time.monotonic()] = traceback.format_exc()

    def _look(self) -> None:
        engines = self.engines_now()
        now = time.monotonic()
        for pid in engines:
            self.first_seen.setdefault(pid, now)
        if engines:
            self.alive_at.append(now)
        if engines or _engines_on_the_machine():
            self.anywhere_at.append(now)

    def started_between(self, start: float, end: float) -> list[int]:
        # A copy: the polling thread adds to the dict meanwhile.
        return [pid for pid, seen in list(self.first_seen.items()) if start <= seen <= end]

    def failures_between(self, start: float, end: float) -> list[str]:
        return [trace for at, trace in list(self.failed_at.items()) if start <= at <= end]

    def alive_between(self, start: float, end: float) -> bool:
        """Whether an engine process lived during [start, end]; a test shorter than a poll that uses a
        shared engine is answered by a look now (the shared engine still lives)."""
        return any(start <= seen <= end for seen in self.alive_at) or bool(self.engines_now())

    def ran_anywhere_between(self, start: float, end: float) -> bool:
        return any(start <= seen <= end for seen in self.anywhere_at) or bool(_engines_on_the_machine())

    def engines_now(self) -> list[int]:
        return [pid for pid in _descendants(os.getpid()) if ENGINE_PROCESS in _cmdline(pid)]

    def close(self) -> None:
        self._stop.set()


def _descendants(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    # Not `Path.glob`, which raises any error of its own stats but four (ENOENT and kin): here any
    # error reading one process (exiting meanwhile) skips it. Bytes: a process's name need not be UTF-8.
    for pid in _process_ids():
        try:
            fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents.setdefault(int(fields[1]), []).append(pid)
    found, frontier = [], [root]
    while frontier:
        children = parents.get(frontier.pop(), [])
        found += children
        frontier += children
    return found


def _engines_on_the_machine() -> list[int]:
    return [pid for pid in _process_ids() if ENGINE_PROCESS in _cmdline(pid)]


def _process_ids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or config.getoption("dist", "no") == "no":  # a process that collects
        # Collection imports torch, Lightning and transformers, all of which lives as long as the
        # session: the collector's walks over it while collecting free nothing, and took 3.6 s of
        # a 14.3 s collection of the fast part (measured). `pytest_collection_finish` freezes it.
        gc.disable()
    _share_the_cores(config)
    config.stash[_WATCH] = EngineWatch()
    if not hasattr(config, "workerinput"):  # the session's own process (xdist's controller, or plain pytest)
        # Before the workers start: they, and every process they start, inherit the temp dir.
        config.stash[_SESSION_TEMP_DIR] = start_session_temp_dir()
        config.stash[_LISTING] = listing()


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch, Lightning, transformers: millions of objects) lives until the
    session ends: frozen, Python's full garbage collections no longer walk it. They still walk what
    tests import later (vLLM, matplotlib) and run ten times less often than by default: young
    garbage is collected as before. Measured per worker in `make test-fast`: full collections took
    3.2-4.8 s in all (0.3-0.9 s each) before, 1.6-2.8 s after."""
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, 100)
    gc.enable()


@pytest.hookimpl(tryfirst=True)
def pytest_warning_recorded(warning_message: warnings.WarningMessage) -> None:
    """A worker reports a warning as its nearest builtin class, with the original class named in the text.

    xdist's controller rebuilds each warning a worker reports by importing its class's module: the
    first of Lightning's `PossibleUserWarning`s made it import Lightning, in the thread that receives
    that worker's reports, and the worker waited 1.4-5.4 s for its next test (measured in every
    `make test-fast`). This runs before xdist's own hook sends the warning."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    message = warning_message.message
    kind = type(message) if isinstance(message, Warning) else warning_message.category
    if kind.__module__ == "builtins" and warning_message.category.__module__ == "builtins":
        return
    builtin = next(cls for cls in kind.__mro__ if cls.__module__ == "builtins")
    warning_message.message = builtin(f"{kind.__module__}.{kind.__qualname__}: {message}")
    warning_message.category = builtin


def _share_the_cores(config: pytest.Config) -> None:
    """Under several xdist workers, each worker and the runs it starts get their share of the cores
    for torch's thread pool. With a pool per core in every worker and every run, OpenMP's spinning
    pools on a 2-core machine slow each other several times over (measured: two 120-step warm starts
    at once took over 90 s each, 17-20 s alone)."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1:
        import torch

        threads = str(max(1, (os.cpu_count() or 1) // workers))
        os.environ["OMP_NUM_THREADS"] = threads  # runs this worker starts read it at their start
        torch.set_num_threads(int(threads))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash[_WATCH].close()
    if hasattr(config, "workerinput"):
        _exit_without_finalizing()


def _exit_without_finalizing() -> None:
    """An xdist worker ends here, once it has sent its last report and run every other unconfigure hook:
    its exit handlers run (they remove what the process made, such as multiprocessing's temp dir),
    then the process ends without Python's finalization.

    That finalization (freeing every module and object of a process that imported torch,
    transformers and vLLM) takes 1.4 s on its own, and the controller waits for both workers'
    processes to end before it reports: measured 4.0 s between the workers' last test and the
    session's end in `make test-fast`. The session's own check of /tmp and /dev/shm still runs after."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    item.stash[_STARTED_AT] = time.monotonic()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    yield
    # A look as the test body ends: the last test on a module-scoped engine may be shorter than a
    # poll, and that engine is shut down by the teardown before the check below runs.
    if item.get_closest_marker("engine") is not None:
        item.stash[_ENGINE_AFTER_CALL] = bool(item.config.stash[_WATCH].engines_now())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    yield
    # No wait for a last poll: an engine takes many polls to start, and lives through many more.
    watch, start, end = item.config.stash[_WATCH], item.stash[_STARTED_AT], time.monotonic()
    marked = item.get_closest_marker("engine") is not None
    started = watch.started_between(start, end)
    if started and not marked:
        pytest.fail(f"{item.nodeid} started a vLLM engine (pids {started}) but has no `engine` mark", pytrace=False)
    if not marked:  # no look at /proc after an engine-free test: 7.5 s of the fast part's teardowns had gone to it
        return
    # Ray starts its workers (and so the engines placed on them) from its own daemons, which need not
    # be our descendants: a test of the `ray` group counts an engine process anywhere.
    ray_group = any(mark.args == ("ray",) for mark in item.iter_markers("xdist_group"))
    ran = watch.alive_between(start, end) or item.stash.get(_ENGINE_AFTER_CALL, False)
    if not ran and not (ray_group and watch.ran_anywhere_between(start, end)):
        failures = "".join(
            f"\na poll of the engine watch failed meanwhile:\n{trace}" for trace in watch.failures_between(start, end)
        )
        pytest.fail(f"{item.nodeid} has the `engine` mark but no vLLM engine ran during it{failures}", pytrace=False)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    before = session.config.stash.get(_LISTING, None)
    if before is None:
        return
    # Processes ending now (xdist's workers, what they started) may still be removing their files:
    # more looks while any process below this one lives (up to 10 s), and one after they are gone.
    deadline = time.monotonic() + 10
    left = left_behind(before)
    while left and _descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.5)
        left = left_behind(before)
    if left:
        time.sleep(0.5)
        left = left_behind(before)
    shutil.rmtree(session.config.stash[_SESSION_TEMP_DIR], ignore_errors=True)
    if left:
        session.config.get_terminal_writer().line(
            f"\nthe test session left {len(left)} entries in its temp dir, /tmp or /dev/shm: {left}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_WATCH = pytest.StashKey[EngineWatch]()
_LISTING = pytest.StashKey[set]()
_SESSION_TEMP_DIR = pytest.StashKey[Path]()
_STARTED_AT = pytest.StashKey[float]()
_ENGINE_AFTER_CALL = pytest.StashKey[bool]()
