"""The real entry points (Hydra, Lightning CLI, Hydra multirun) with the real engine and trainer."""

import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support.runs import SMALL_KV_CACHE_GIB, SMALL_RUN, read_rows, read_warm_start, run_command, run_hydra

# One xdist worker runs this module's tests: they share module-scoped runs or engines.
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("test_entry_points")]


@pytest.fixture(scope="module")
def hydra_run(tmp_path_factory):
    """A 5-step Hydra run with a periodic checkpoint every 2 steps, TensorBoard beside the CSV log
    and both group filters on: (run dir, its console output). (Resuming a run: `test_resume.py`.)"""
    run_dir = tmp_path_factory.mktemp("hydra_run")
    filters = ["rollout.filter_zero_advantage=true", "rollout.filter_overlong=true"]
    # A new interpreter (not the worker's preloaded one): what its imports print is on the console too.
    result = run_command(
        [
            sys.executable,
            "-m",
            "lit_asyncrl.train",
            "trainer.max_steps=5",
            "checkpoint_every=2",
            "logger=tensorboard",
            *filters,
            f"hydra.run.dir={run_dir}",
            *SMALL_RUN,
        ]
    )
    return run_dir, result.stdout + result.stderr


def test_hydra_run_trains_logs_and_plots(hydra_run):
    run_dir, console = hydra_run
    rows = read_rows(run_dir / "metrics.csv")
    # A quiet console: no vLLM reload warning or loading bar per weight push, no traceback at exit.
    assert "Failed to load weights" not in console and "Loading safetensors" not in console
    assert "Traceback" not in console and "Exception ignored" not in console
    # Nor vLLM's Triton check (in the trainer and in the engine's process) or Lightning's cloud-logger tip.
    assert "Triton is installed" not in console and "litlogger" not in console
    # Nor transformers' bar for each load of the policy's weights.
    assert "Loading weights" not in console
    assert_no_console_warts(console)
    # The warm start is its own fit, logged apart; its NLL falls.
    warm = read_warm_start(run_dir)
    assert len(warm) == 5 and warm[-1]["warm_start/nll"] < warm[0]["warm_start/nll"]
    assert [row["step"] for row in rows] == [0, 1, 2, 3, 4]
    assert (run_dir / "training_curves.png").stat().st_size > 10_000
    # logger=tensorboard: the same steps and values in TensorBoard's event file as in the CSV log.
    (events,) = (run_dir / "tensorboard").glob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    assert [(event.step, event.value) for event in accumulator.Scalars("train/task_success")] == [
        (int(row["step"]), pytest.approx(row["train/task_success"])) for row in rows
    ]
    # The latest periodic checkpoint (every 2 steps, older ones replaced) and the final state in last.ckpt.
    assert sorted(path.name for path in (run_dir / "checkpoints").glob("*.ckpt")) == ["last.ckpt", "step=4.ckpt"]
    for row in rows:
        assert 0.0 <= row["train/task_success"] <= 1.0
        # Nothing is lost: every episode produced is trained, dropped with a reason, or pending.
        assert row["rollout/produced"] == row["rollout/trained"] + row["rollout/dropped"] + row["rollout/pending"]
        assert row["rollout/dropped"] == sum(value for key, value in row.items() if key.startswith("rollout/dropped_"))
    # Groups whose episodes all got the same reward were dropped, and the batches filled from others
    # (each of 5 batches holds 4 groups of 4); the filters' counts are logged.
    last = rows[-1]
    assert last["rollout/dropped_zero_advantage"] > 0 and last["rollout/dropped_zero_advantage"] % 4 == 0, last
    assert (
        last["rollout/trained"] == 5 * 4 * 4
        and {"rollout/zero_advantage_kept", "rollout/masked_overlong"} <= last.keys()
    )
    # Step 0 trains on tokens sampled by the very weights it scores with (fp32 engine, same
    # temperature): pi_theta / mu must be 1 up to numerical noise, or the log-probs are misaligned.
    first = rows[0]
    assert first["train/version_gap_max"] == 0
    assert abs(first["train/ratio_max"] - 1) < 1e-3 and abs(first["train/ratio_min"] - 1) < 1e-3


#: What a user read as trouble on every run (the front-door issue): each must stay off the console.
CONSOLE_WARTS = (
    "Epoch 0/-2",  # the progress bar of a stream without epochs
    "exists and is not empty",  # Lightning's CSV logger on a run dir holding Hydra's files and the warm start's log
    "args parameter is intended",  # the CLI handed sys.argv twice
)


def assert_no_console_warts(console: str) -> None:
    assert [wart for wart in CONSOLE_WARTS if wart in console] == []
    assert "RL" in console and "Warm start" in console  # the bars name their phases


def test_lightning_cli_fit_with_a_chosen_loss_and_reference(tmp_path):
    result = run_command(
        [
            sys.executable,
            "-m",
            "lit_asyncrl.cli",
            "fit",
            "--config",
            "conf/cli/default.yaml",
            "--trainer.max_steps",
            "3",
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
            "--trainer.default_root_dir",
            str(tmp_path),
            "--data.rollout.batch.group_size",
            "4",
            "--data.rollout.batch.groups_per_batch",
            "4",
            "--data.rollout.batch.buffer_capacity",
            "32",
            "--data.rollout.engine.kv_cache_gib",
            str(SMALL_KV_CACHE_GIB),
            "--warm_start.steps",
            "5",
            "--model.loss",
            "DecoupledPPO",
            "--model.loss.init_args.clip_bounds",
            "[0.7, 1.4]",
            "--model.reference",
            "SnapshotReference",
        ]
    )
    (csv_path,) = (path for path in tmp_path.glob("**/metrics.csv") if "warm_start" not in path.parts)
    rows = read_rows(csv_path)
    assert len(rows) == 3
    assert all(row["train/ref_behavior_logratio_absmax"] < 1e-4 for row in rows)  # exact pi_old via the CLI
    assert all("snapshot/resident" in row for row in rows)
    assert (csv_path.parent / "training_curves.png").exists()
    warm = read_warm_start(tmp_path)
    assert len(warm) == 5  # the warm start ran as its own fit, before RL (which starts at step 0)
    assert rows[0]["step"] == 0
    assert_no_console_warts(result.stdout + result.stderr)


def test_hydra_multirun_over_two_losses_side_by_side_in_sync_mode_trains_on_policy(tmp_path):
    # One sweep, three properties: both jobs of a two-loss sweep run, side by side under the
    # parallel launcher, and sync mode trains on policy.
    run_hydra(
        [
            "-m",
            "hydra/launcher=parallel",
            "hydra.launcher.n_jobs=2",
            "loss=ppo_clip_train_infer,decoupled_ppo",
            "reference=async_recompute",
            "rollout=sync",
            "trainer.max_steps=4",
            f"hydra.sweep.dir={tmp_path}",
            *SMALL_RUN,
        ],
        timeout_s=900,
    )
    jobs = sorted(tmp_path.glob("[01]_*"))
    assert len(jobs) == 2
    for job in jobs:
        rows = read_rows(job / "metrics.csv")
        assert len(rows) == 4
        # Every token of every batch was sampled by the weights being trained: no staleness at all.
        assert all(row["train/version_gap_max"] == 0 for row in rows)
        assert all(abs(row["train/ratio_max"] - 1) < 1e-3 for row in rows)
    # Side by side: each job started (wrote its hparams) before the other one finished.
    started = [(job / "hparams.yaml").stat().st_mtime for job in jobs]
    finished = [(job / "summary.json").stat().st_mtime for job in jobs]
    assert started[0] < finished[1] and started[1] < finished[0]
