"""`logger=tensorboard` and `logger=wandb` add a live view beside the CSV log, through the real entry
point, module and Lightning loggers (two steps on the replay service of `tests/support/replay_service.py`, no engine)."""

from __future__ import annotations

import csv
import tempfile

import pytest

from lit_asyncrl.train import run
from tests.support.configs import compose_train
from tests.support.replay_service import ReplayServices


def two_steps(tmp_path, logger: str) -> None:
    cfg = compose_train(
        [
            f"logger={logger}",
            f"data.service._target_={ReplayServices.__module__}.ReplayServices",
            "trainer.max_steps=2",
            "model.warm_start_steps=0",
            f"hydra.run.dir={tmp_path}",
            f"hydra.runtime.output_dir={tmp_path}",
            f"trainer.default_root_dir={tmp_path}",
            f"trainer.logger.save_dir={tmp_path}",
        ]
    )
    assert run(cfg).completed


def csv_steps(tmp_path) -> list[int]:
    with open(tmp_path / "metrics.csv") as metrics:
        return sorted({int(row["step"]) for row in csv.DictReader(metrics) if row.get("train/loss")})


def test_tensorboard_writes_event_files_beside_the_csv_log(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    two_steps(tmp_path, "tensorboard")
    (events,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    # The same two training steps in both logs, with the loss the replay service's batches give (-0.25).
    assert [event.step for event in accumulator.Scalars("train/loss")] == csv_steps(tmp_path) == [0, 1]
    assert all(event.value == pytest.approx(-0.25, abs=1e-5) for event in accumulator.Scalars("train/loss"))


def test_wandb_writes_an_offline_run_beside_the_csv_log(tmp_path, monkeypatch):
    # wandb makes two temp dirs when imported and removes them only as the process exits: made in
    # the test's dir, they cannot outlive the worker in /tmp and hold up the session's leftover check.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pytest.importorskip("wandb")
    monkeypatch.undo()
    monkeypatch.setenv("WANDB_SILENT", "true")
    two_steps(tmp_path, "wandb")
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list(run_dir.glob("run-*.wandb"))  # the run's records, for `wandb sync`
    assert csv_steps(tmp_path) == [0, 1]
    import wandb

    assert wandb.run is None  # finished with its run: a next job of a multirun gets its own
