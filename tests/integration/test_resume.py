"""A run SIGKILLed mid-training resumes from its last periodic checkpoint without losing count."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from tests.integration.runs import SMALL_RUN, read_rows, run_hydra
from tests.integration.test_cleanup import Run

# Compares listings, as the cleanup tests do, in the group of runs stopped from outside.
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("cleanup_signals")]


def wait_for_complete_checkpoint(run: Run, name: str, timeout_s: float = 300):
    path = run.run_dir / "checkpoints" / name
    run.wait_for(path.exists, name, timeout_s)
    size = -1
    while size != path.stat().st_size:  # still being written
        size = path.stat().st_size
        time.sleep(1.0)
    return path


def test_sigkill_mid_run_then_resume_keeps_version_ewma_and_accounting(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    # Slow answers (0.5 s) keep each step a few seconds long: step=3.ckpt lives until step=6.ckpt replaces it.
    slow = ["env.latency_s=0.5", "trainer.num_sanity_val_steps=0"]
    # beta from the observed staleness window (W / (W + 2)): the window is part of the EWMA's state.
    # Weights reach the engine every second step, so the first run trains on stale tokens whatever
    # the timing (with a push every step, a trainer quicker than the 0.5 s before an episode's first
    # turn trained three on-policy batches, and the window stayed 0: seen once).
    stale = ["rollout.weight_sync_every=2"]
    run = Run(["experiment=ppo_ewma", "reference.beta=null", "checkpoint_every=3", "trainer.max_steps=500", *slow, *stale], first)
    checkpoint_path = wait_for_complete_checkpoint(run, "step=3.ckpt")
    os.kill(run.process.pid, signal.SIGKILL)
    run.process.wait(timeout=10)
    run.assert_nothing_left()  # the reaper took the engine down

    checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 3
    saved = checkpoint["RolloutDataModule"]["rollout_service"]["accounting"]
    assert saved["produced"] == saved["trained"] + sum(saved["dropped"].values()) + saved["pending"]
    ewma_states = [state for key, state in checkpoint["callbacks"].items() if "EWMAReference" in key]
    assert len(ewma_states) == 1

    run_hydra(
        [
            "experiment=ppo_ewma",
            "reference.beta=null",
            "trainer.max_steps=6",
            f"ckpt_path='{checkpoint_path}'",
            f"hydra.run.dir={second}",
            "trainer.num_sanity_val_steps=0",
            *SMALL_RUN,
        ]
    )
    rows = read_rows(second / "metrics.csv")
    assert [row["step"] for row in rows] == [3, 4, 5]  # the version continues from the checkpoint
    assert not (second / "warm_start").exists()  # no second warm start on resume (SMALL_RUN asks for one)
    # The engine served the checkpoint's weights as version 3 before any rollout: on-policy first batch.
    assert rows[0]["train/version_gap_max"] == 0
    assert abs(rows[0]["train/ratio_max"] - 1) < 1e-3 and abs(rows[0]["train/ratio_min"] - 1) < 1e-3
    for row in rows:  # produced = trained + dropped (by reason) + pending, the first run's included
        assert row["rollout/produced"] == row["rollout/trained"] + row["rollout/dropped"] + row["rollout/pending"]
        assert row["rollout/dropped_restart"] == saved["pending"]  # the checkpoint's pending, not kept
        assert row["rollout/trained"] >= saved["trained"] and row["rollout/produced"] >= saved["produced"]
    # The EWMA state the resumed run starts from is the checkpoint's. Its first batch is on policy
    # (gap 0), so the window its beta comes from is the checkpoint's alone: a fresh EWMA would have
    # observed no gap and used beta 0. Its reset counter carries on (one more if that step reset).
    window = ewma_states[0]["observed_window"]
    assert window is not None and window > 0  # the first run trained on stale tokens
    assert rows[0]["reference/ewma_beta"] == pytest.approx(window / (window + 2))
    assert rows[0]["reference/ewma_resets"] - ewma_states[0]["num_resets"] in (0.0, 1.0)
