"""However a run ends (a failing environment, a dead worker, SIGINT, SIGTERM, SIGKILL, also while
the trainer waits for a batch), it exits promptly, says what failed, and leaves no process of its
own and nothing new in /tmp or /dev/shm (listings before and after the run, `tests/support/leftovers.py`)."""

import os
import signal
import time

import pytest

from tests.support.runs import read_rows
from tests.support.tracked_runs import Run, _cmdline, alive
from tests.support.xdist_groups import FAILING_FROM_INSIDE, STOPPED_FROM_OUTSIDE

# Each test compares listings of /tmp and /dev/shm before and after its run (another worker's runs
# may go on meanwhile; what they hold is not counted). They run in two xdist groups of about equal
# length, each one test after another: runs that fail from inside and runs
# stopped from outside, so at most two lifecycle runs share the machine. (xdist joins every group
# mark of a test into one name, so each test carries exactly one.)
pytestmark = pytest.mark.engine


FAULTY_ENV = [
    "env=guess_number",
    "env._target_=tests.integration.faulty_env.FaultyGuessNumberEnv",
    "trainer.num_sanity_val_steps=0",
]


@FAILING_FROM_INSIDE
def test_sparse_environment_failures_are_dropped_and_counted_and_failing_too_often_stops_the_run(tmp_path):
    # Every 20th agent turn raises (about one episode in six): those episodes are dropped with the
    # reason env_error, counted, and training goes on. From turn 411 on every turn raises: each
    # episode is dropped until more than half of the last 16 failed, and the run stops naming the
    # counts and the tool's own error, leaving nothing behind. (Not 400: turn 400 is also a 20th
    # turn, whose hiccup was once the last error the message named.)
    overrides = [
        *FAULTY_ENV,
        "+env.fail_every=20",
        "+env.fail_after=410",
        "rollout.env_failure_window=16",
        "trainer.max_steps=50",
    ]
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
    overrides = [
        "trainer.max_steps=500",
        "checkpoint_every=1",
        "rollout.engine_restarts=1",
        "trainer.num_sanity_val_steps=0",
    ]
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
