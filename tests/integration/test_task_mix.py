"""A mixture of tasks on the real engine: one Hydra run trains on three tasks, each played in its own
format, and logs held-out success per task beside the overall value."""

from __future__ import annotations

import pytest

from tests.integration.runs import read_all_rows, run_hydra, small_run_from
from tests.integration.warm_policies import warm_started_policy

pytestmark = pytest.mark.engine

TASKS = ("desk", "desk_customer", "guess_number")


def test_a_mixture_run_trains_on_every_task_and_validates_each_on_its_own(tmp_path, warm_policy_root):
    policy = warm_started_policy(warm_policy_root, "task_mix", steps=120)
    run_hydra(
        [
            "experiment=task_mix",
            *small_run_from(policy),
            "trainer.max_steps=6",
            "trainer.val_check_interval=3",
            # two held-out instances per task (guess-the-number holds out exactly two secrets)
            "rollout.eval_instances=6",
            "rollout.eval_samples=4",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    rows = read_all_rows(tmp_path / "metrics.csv")
    validations = [row for row in rows if "val/avg@4" in row]
    # once before the first RL step (after the warm start) and after steps 3 and 6
    assert [int(row["step"]) for row in validations] == [0, 2, 5]
    for row in validations:
        for task in TASKS:
            assert 0.0 <= row[f"val/{task}/avg@4"] <= row[f"val/{task}/pass@4"] <= 1.0
            assert row[f"val/{task}/greedy_success"] in (0.0, 0.5, 1.0)  # two greedy episodes per task
        # Two instances per task: the overall value is the mean of the tasks' values, exactly.
        for metric in ("avg@4", "pass@4", "greedy_success"):
            assert row[f"val/{metric}"] == pytest.approx(sum(row[f"val/{task}/{metric}"] for task in TASKS) / 3, abs=1e-6)
    # Training: 6 steps of 4 groups drawn evenly from 3 tasks (a task missing from all 24 groups has
    # a chance of (2/3)^24 = 6e-5); every task's success shows up in some step's row.
    trained = {task: [row[f"train/{task}/task_success"] for row in rows if f"train/{task}/task_success" in row] for task in TASKS}
    assert all(trained[task] for task in TASKS), trained
    assert all(0.0 <= value <= 1.0 for values in trained.values() for value in values)
    # The accounting per task adds up to the run's (no environment failed an episode here).
    last = [row for row in rows if "rollout/produced" in row][-1]
    assert last["rollout/env_failures"] == 0
    for outcome in ("produced", "trained", "dropped_stale"):
        assert sum(last.get(f"rollout/{task}/{outcome}", 0.0) for task in TASKS) == last[f"rollout/{outcome}"], outcome
    assert last["rollout/trained"] == 6 * 4 * 4  # 6 steps of 4 groups of 4
    # Each task played in its own format: the game's turns end at ';' and the desk's at a newline, and
    # both are won (random valid guesses win 0.34 of the games; the desk needs its demonstrations).
    assert max(row["val/guess_number/avg@4"] for row in validations) > 0.0
    assert max(row["val/desk/avg@4"] for row in validations) > 0.0
    assert (tmp_path / "training_curves.png").exists()
