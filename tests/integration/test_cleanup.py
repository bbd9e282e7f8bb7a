"""However a run ends (a failing environment, a dead worker, SIGINT, SIGTERM, SIGKILL, also while
the trainer waits for a batch), it exits promptly, says what failed, and leaves no process of its
own and nothing new in /tmp or /dev/shm (listings before and after the run, `tests/leftovers.py`)."""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from lit_asyncrl.rollout.processes.temp_dirs import WEIGHTS_DIR_PREFIX
from tests.integration.runs import REPO, SMALL_RUN, read_rows
from tests.leftovers import OWNED, left_behind, listing

# Each test compares listings of /tmp and /dev/shm before and after its run (another worker's runs
# may go on meanwhile; what they hold is not counted). They run in two xdist groups of about equal
# length, each one test after another: runs that fail from inside and runs
# stopped from outside, so at most two lifecycle runs share the machine. (xdist joins every group
# mark of a test into one name, so each test carries exactly one.)
pytestmark = pytest.mark.engine
FAILING_FROM_INSIDE = pytest.mark.xdist_group("cleanup_failures")
STOPPED_FROM_OUTSIDE = pytest.mark.xdist_group("cleanup_signals")
SHM = Path("/dev/shm")


def children_of(pid: int) -> list[int]:
    """Every live descendant of `pid` (by parent links in /proc)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [child for child, ppid in parents.items() if ppid == parent]
        found += kids
        frontier += kids
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def engine_temp_dirs(owner_pid: int) -> set[str]:
    """The engine weights dirs made by process `owner_pid` (their names carry it), so that runs of
    other tests at the same time do not count."""
    return {path.name for path in SHM.glob(f"{WEIGHTS_DIR_PREFIX}{owner_pid}_*")} if SHM.is_dir() else set()


class Run:
    """A Hydra run in a subprocess; every process it starts is recorded while it runs.

    (vLLM renames its processes, which overwrites their environment, so they are tracked by
    parent links, not by an inherited marker.)
    """

    def __init__(self, overrides: list[str], run_dir: Path, env: dict[str, str] | None = None) -> None:
        self.run_dir = run_dir
        self.started_at = time.time()
        self.listing_before = listing()
        self.descendants: set[int] = set()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        command = [sys.executable, "-m", "lit_asyncrl.train", f"hydra.run.dir={run_dir}", *SMALL_RUN, *overrides]
        self.process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_default_sigint
        )

    def track(self) -> list[int]:
        kids = children_of(self.process.pid)
        self.descendants.update(kids)
        return kids

    def engine_cores(self) -> list[int]:
        """The run's live vLLM engine-core processes (each runs its model worker in-process)."""
        return [pid for pid in self.track() if b"VLLM::EngineCore" in _cmdline(pid) and alive(pid)]

    def engine_serving(self) -> bool:
        return bool(self.engine_cores())

    def latest_checkpoint_step(self) -> int:
        """The step of the periodic checkpoint (the latest replaces the one before), -1 before the first."""
        return max((int(path.stem.split("=")[1]) for path in (self.run_dir / "checkpoints").glob("step=*.ckpt")), default=-1)

    def weights_pushed(self) -> bool:
        """The service has started: the first weight push wrote its file in the engine's temp dir."""
        return any((SHM / name / "model.safetensors").exists() for name in engine_temp_dirs(self.process.pid))

    def worker_pids(self) -> list[int]:
        """Spawned multiprocessing children (the dedicated old-logit worker)."""
        return [pid for pid in self.track() if b"spawn_main" in _cmdline(pid)]

    def wait_for(self, condition, what: str, timeout_s: float = 240) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            self.track()
            if self.process.poll() is not None:
                raise AssertionError(f"the run ended before {what}:\n{self.process.stdout.read()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout_s} s")
            time.sleep(0.2)

    def until_it_ends(self, timeout_s: float = 300) -> int:
        """Its exit code, tracking its processes until it ends by itself (e.g. at a kill point).
        Its output is read meanwhile: a full pipe would stop it before it got there."""
        chunks: list[str] = []
        reader = threading.Thread(target=lambda: chunks.append(self.process.stdout.read()), daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None:
            self.track()
            if time.monotonic() > deadline:
                raise AssertionError(f"the run did not end within {timeout_s} s")
            time.sleep(0.2)
        reader.join(timeout=30)  # its orphans may hold the pipe until the reaper ends them
        self.output = "".join(chunks)
        return self.process.returncode

    def finish(self, timeout_s: float = 90) -> tuple[int, str, float]:
        self.track()
        start = time.monotonic()
        output, _ = self.process.communicate(timeout=timeout_s)
        self.output = output
        return self.process.returncode, output, time.monotonic() - start

    def wait_for_training(self) -> None:
        """Until the first periodic checkpoint (the runs use checkpoint_every=1): steps are being taken."""
        self.wait_for(lambda: self.latest_checkpoint_step() >= 0, "training steps")

    def assert_stops(self, since: float, code: int | None = None, says: str | None = None, within_s: float = 30) -> None:
        """The run exits within `within_s` of `since` (with `code`, or any failure), printing `says`, leaving nothing."""
        exit_code, output, _ = self.finish()
        assert exit_code == code if code is not None else exit_code != 0, output[-3000:]
        assert says is None or says in output, output[-3000:]
        assert time.monotonic() - since < within_s
        self.assert_nothing_left()

    def _left_behind(self) -> list[str]:
        return [entry for entry in left_behind(self.listing_before, self.descendants) if _not_our_dead_owners_dir(entry)]

    def assert_nothing_left(self) -> None:
        assert self.descendants, "no child process was ever seen"
        deadline = time.monotonic() + 10  # orphans get a moment to finish exiting
        while [pid for pid in self.descendants if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [pid for pid in self.descendants if alive(pid)]
        assert left == [], [_cmdline(pid) for pid in left]
        while engine_temp_dirs(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert engine_temp_dirs(self.process.pid) == set()
        # Nothing new in /tmp or /dev/shm that no live process holds: no socket, no rendezvous file,
        # no semaphore, no dir of ours (another worker's run, still going, holds its own).
        # multiprocessing's resource tracker unlinks a killed run's semaphores once it notices. A dir
        # of ours whose owner is gone is removed by the next start (`remove_dirs_of_dead_owners`;
        # seen once after the engine-restart run: issue note), so it is not counted here; the
        # session's own listing check, at its end, still counts everything.
        listing_deadline = time.monotonic() + 20
        while self._left_behind() and time.monotonic() < listing_deadline:
            time.sleep(0.5)
        assert self._left_behind() == []
        # vLLM's gloo rendezvous file goes to the run's own dir, never to /tmp: none newer than this
        # run's start, whichever test's engine made it.
        leaked = [p.name for p in Path(tempfile.gettempdir()).glob("vllm_dist_*") if p.stat().st_mtime >= self.started_at]
        assert leaked == []


def _not_our_dead_owners_dir(entry: str) -> bool:
    return OWNED.match(Path(entry).name) is None


def _default_sigint() -> None:
    # A shell that starts a job in the background (`cmd &`, as some CI runners do) starts it with
    # SIGINT ignored, and Python keeps an ignored SIGINT ignored: the run would never see Ctrl-C.
    # A user's terminal delivers it to a foreground run, which is what these tests model.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


FAULTY_ENV = ["env._target_=tests.integration.faulty_env.FaultyGuessNumberEnv", "trainer.num_sanity_val_steps=0"]


@FAILING_FROM_INSIDE
def test_sparse_environment_failures_are_dropped_and_counted_and_failing_too_often_stops_the_run(tmp_path):
    # Every 20th agent turn raises (about one episode in six): those episodes are dropped with the
    # reason env_error, counted, and training goes on. From turn 411 on every turn raises: each
    # episode is dropped until more than half of the last 16 failed, and the run stops naming the
    # counts and the tool's own error, leaving nothing behind. (Not 400: turn 400 is also a 20th
    # turn, whose hiccup was once the last error the message named.)
    overrides = [*FAULTY_ENV, "+env.fail_every=20", "+env.fail_after=410", "rollout.env_failure_window=16", "trainer.max_steps=50"]
    run = Run(overrides, tmp_path)
    run.wait_for(run.engine_serving, "engine start")
    code, output, _ = run.finish(timeout_s=300)
    assert code != 0
    assert "of the last 16 episodes failed in the environment, above rollout.env_failure_limit=0.5" in output
    assert "FaultyGuessNumberEnv.step raised EnvironmentFault('tool crashed on turn 4" in output
    rows = read_rows(tmp_path / "metrics.csv")
    # (a drop reason is logged from its first drop on)
    first_drop = next(index for index, row in enumerate(rows) if row.get("rollout/dropped_env_error", 0) >= 1)
    assert first_drop < len(rows) - 1  # trained on after an episode was dropped
    for row in rows:
        assert row["rollout/env_failures"] >= row.get("rollout/dropped_env_error", 0)
        assert row["rollout/produced"] == row["rollout/trained"] + row["rollout/dropped"] + row["rollout/pending"]
    run.assert_nothing_left()


@STOPPED_FROM_OUTSIDE
@pytest.mark.parametrize(("signum", "expected_code"), [(signal.SIGTERM, 143), (signal.SIGINT, 1)])
def test_a_signal_while_ddp_ranks_wait_for_a_batch_stops_both_ranks_and_cleans_up(tmp_path, signum, expected_code):
    # Two training processes (rank 1 started by Lightning from the same command line), the engine
    # on rank 0. Every environment answer takes 2 s: the ranks are waiting for their first batch
    # when the signal comes (no held-out evaluation before training, so the wait for the batch is
    # what is interrupted). SIGTERM or Ctrl-C to the command the user started ends both ranks and
    # the engine.
    ddp = ["trainer.devices=2", "trainer.strategy=ddp"]
    run = Run(["env.latency_s=2.0", "trainer.max_steps=5", "trainer.num_sanity_val_steps=0", *ddp], tmp_path)
    run.wait_for(run.weights_pushed, "the service start")
    time.sleep(2)  # the producer is generating, the trainer blocks in next_batch
    assert not (tmp_path / "metrics.csv").exists()
    ranks = [pid for pid in run.track() if b"lit_asyncrl.train" in _cmdline(pid)]
    assert len(ranks) == 1, "Lightning did not start rank 1"
    run.process.send_signal(signum)
    code, output, seconds = run.finish()
    assert code == expected_code, output[-3000:]
    assert seconds < 30
    assert "Traceback" not in output.split("Detected KeyboardInterrupt")[-1] or signum == signal.SIGTERM
    run.assert_nothing_left()


@STOPPED_FROM_OUTSIDE
def test_sigterm_while_the_engine_starts_exits_and_cleans_up(tmp_path):
    run = Run(["trainer.max_steps=5"], tmp_path)
    run.wait_for(run.engine_serving, "vLLM's processes")
    assert not run.weights_pushed()  # still inside the engine's start
    run.process.send_signal(signal.SIGTERM)
    run.assert_stops(time.monotonic(), code=143)


@FAILING_FROM_INSIDE
def test_an_engine_that_stops_answering_fails_the_run_within_the_stall_timeout(tmp_path):
    # SIGSTOP freezes the engine core: its processes live on, but no token comes. The run reports
    # it within the configured stall timeout and still leaves no process behind. 15 s: a healthy
    # engine beside the other test worker's runs on 2 cores went 6 s, and once over 10 s, without
    # output (a false stall could only fail this run before the SIGSTOP, a few seconds of it).
    stall_timeout_s = 15
    run = Run(["trainer.max_steps=500", f"rollout.engine_stall_timeout_s={stall_timeout_s}"], tmp_path)
    run.wait_for_training()
    (engine_core,) = run.engine_cores()
    os.kill(engine_core, signal.SIGSTOP)
    try:
        # Caught by the trainer's batch wait (no output with requests in flight) or by a weight push
        # that gets no answer, whichever comes first; both name the stall and the setting.
        run.assert_stops(time.monotonic(), says="stopped answering", within_s=stall_timeout_s + 25)
        assert "rollout.engine_stall_timeout_s" in run.output  # the key a Hydra user sets
    finally:
        os.kill(engine_core, signal.SIGCONT) if alive(engine_core) else None


@FAILING_FROM_INSIDE
def test_a_dead_engine_is_restarted_once_and_a_second_death_fails_the_run_within_seconds_naming_it(tmp_path):
    # rollout.engine_restarts=1: the killed engine core is replaced by a new engine serving the
    # latest published weights and version; its episodes in flight count as dropped "lost". Once
    # the run has trained on the new engine, its death is one more than allowed: the run fails
    # within seconds, naming it, and leaves nothing behind.
    overrides = ["trainer.max_steps=500", "checkpoint_every=1", "rollout.engine_restarts=1", "trainer.num_sanity_val_steps=0"]
    run = Run(overrides, tmp_path)
    run.wait_for_training()
    (first_core,) = run.engine_cores()
    os.kill(first_core, signal.SIGKILL)
    killed_at_step = run.latest_checkpoint_step()
    run.wait_for(lambda: len([pid for pid in run.engine_cores() if pid != first_core]) == 1, "a new engine")
    (second_core,) = [pid for pid in run.engine_cores() if pid != first_core]
    run.wait_for(lambda: run.latest_checkpoint_step() >= killed_at_step + 4, "steps on the new engine")
    os.kill(second_core, signal.SIGKILL)
    run.assert_stops(time.monotonic(), says="the vLLM engine died")
    assert "restarting it with the weights of version" in run.output
    rows = read_rows(tmp_path / "metrics.csv")
    for row in rows:
        assert row["rollout/produced"] == row["rollout/trained"] + row["rollout/dropped"] + row["rollout/pending"]
    # Every batch after the restart was generated by weights at most max_version_gap (3) old.
    restarted = [row for row in rows if row["rollout/engine_restarts"] == 1]
    assert len(restarted) >= 3 and all(row["train/version_gap_max"] <= 3 for row in restarted)
