"""A second `RolloutService`, named in the Hydra config (`data.service._target_`), trains through the
real entry point, DataModule, module and callbacks: the seam a new implementation plugs into.

`ReplayService` (`tests/support/replay_service.py`) hands out one hand-made batch
(`tests/support/batches.py`), its mu scored by
the service itself with the weights it was last given: every batch is on-policy, so the loss of
each step is the hand value of `test_training_step` (-0.25), and the published weights are checked
to reach the service (its mu moves between the two batches). No engine starts.
"""

from __future__ import annotations

import csv
import math

from lit_asyncrl.train import run
from tests.support.batches import all_version, make_batch
from tests.support.configs import compose_train
from tests.support.replay_service import ReplayServices


def test_a_second_service_named_in_the_config_trains_two_steps(tmp_path):
    ReplayServices.built.clear()
    cfg = compose_train(
        [
            f"data.service._target_={ReplayServices.__module__}.ReplayServices",
            "trainer.max_steps=2",
            "model.warm_start_steps=0",
            f"hydra.run.dir={tmp_path}",
            f"hydra.runtime.output_dir={tmp_path}",  # set by a Hydra app, not by compose: the checkpoints' dir
            f"trainer.default_root_dir={tmp_path}",
            f"trainer.logger.save_dir={tmp_path}",
        ]
    )
    outcome = run(cfg)

    (service,) = ReplayServices.built
    assert outcome.completed and outcome.global_zero
    # Set up for one process before the launch (and again by the fit's set-up, which changes
    # nothing), started at version 0, two batches each at the version they were scored with,
    # versions 1 and 2 published after the steps, closed.
    lifecycle = [call for call in service.calls if call[0] != "close"]
    assert lifecycle == [
        ("configure", 1, 0),
        ("launch_early",),
        ("configure", 1, 0),
        ("start", 0, True),
        # The sanity validation: the range game's ten held-out instances in chunks of at most eight,
        # rollout.eval_samples=8 each.
        ("evaluate", 8, 8),
        ("evaluate", 2, 8),
        ("next_batch", 0),
        ("publish", 1),
        ("next_batch", 1),
        ("publish", 2),
    ]
    assert service.calls.count(("close",)) >= 1
    # The published weights reached the service: the second batch's mu is another policy's.
    first, second = service.behaviors
    policy_tokens = make_batch(all_version(0), success=[0.0] * 4)["loss_mask"]
    assert (first - second)[policy_tokens].abs().max() > 1e-4
    # Both steps on-policy: loss = -(token mean of A) = -(3 + 2 - 1 - 2) / 8, as by hand.
    with open(tmp_path / "metrics.csv") as metrics:
        rows = list(csv.DictReader(metrics))
    losses = [float(row["train/loss"]) for row in rows if row["train/loss"]]
    assert len(losses) == 2 and all(math.isclose(loss, -0.25, abs_tol=1e-5) for loss in losses)
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    # The sanity validation's result, logged at step 0: every held-out episode failed.
    assert [float(row["val/avg@4"]) for row in rows if row.get("val/avg@4")] == [0.0]
