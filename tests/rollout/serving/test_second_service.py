"""A second `RolloutService`, named in the Hydra config (`data.service._target_`), trains through the
real entry point, DataModule, module and callbacks: the seam a new implementation plugs into.

`ReplayService` hands out one hand-made batch (`test_training_step.make_batch`), its mu scored by
the service itself with the weights it was last given: every batch is on-policy, so the loss of
each step is the hand value of `test_training_step` (-0.25), and the published weights are checked
to reach the service (its mu moves between the two batches). No engine starts.
"""

from __future__ import annotations

import csv
import math

import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.rollout.service import RolloutService, ServiceFactory
from lit_asyncrl.scoring import token_logprobs
from lit_asyncrl.train import run
from tests.test_configs import compose_train
from tests.unit.test_training_step import TEMPERATURE, TOP_K, all_version, make_batch


class ReplayService:
    """Replays one batch, scored on-policy with the latest weights; records every call."""

    max_version_gap = 3
    weight_sync_every = 1
    groups_per_batch = 2

    def __init__(self, model_path, seed: int) -> None:
        self.scorer = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
        self.seed, self.version = seed, -1
        self.calls: list[tuple] = []
        self.behaviors: list[torch.Tensor] = []

    def configure(self, world_size: int, rank: int) -> RolloutService:
        self.calls.append(("configure", world_size, rank))
        return self

    def state_dict(self) -> dict:
        return {"batches": len(self.behaviors)}

    def load_state_dict(self, state: dict) -> None:
        self.calls.append(("load_state_dict", state))

    def use_dedicated_worker(self) -> None:
        raise AssertionError("not with reference=none")

    def launch_early(self) -> None:
        self.calls.append(("launch_early",))

    def start(self, weights, version: int, train: bool = True) -> None:
        self.calls.append(("start", version, train))
        self._load(weights, version)

    def next_batch(self, timeout_s: float) -> dict:
        self.calls.append(("next_batch", self.version))
        layout = make_batch(all_version(self.version), success=[1.0, 0.0, 1.0, 1.0])
        with torch.no_grad():
            behavior = token_logprobs(self.scorer, layout["input_ids"], layout["attention_mask"], TEMPERATURE, TOP_K)
        self.behaviors.append(behavior)
        return make_batch(all_version(self.version), success=[1.0, 0.0, 1.0, 1.0], behavior=behavior)

    def publish_weights(self, weights, version: int) -> dict[str, float]:
        self.calls.append(("publish", version))
        self._load(weights, version)
        return {}

    def _load(self, weights, version: int) -> None:
        self.scorer.load_state_dict(weights)
        self.version = version

    def live_versions(self) -> list[int]:
        return [self.version]

    def pause(self) -> None:
        raise AssertionError("not with reference=none")

    def resume(self) -> None:
        raise AssertionError("not with reference=none")

    def score_unscored(self, score_fn, version: int) -> int:
        raise AssertionError("not with reference=none")

    def evaluate(self, instances, samples: int, timeout_s: float) -> dict[str, torch.Tensor]:
        # Plays nothing: every held-out episode fails.
        self.calls.append(("evaluate", len(instances), samples))
        return {
            "success": torch.zeros(len(instances), samples),
            "rewards": torch.zeros(len(instances), samples),
            "greedy_success": torch.zeros(len(instances)),
        }

    def stats(self) -> dict[str, float]:
        return {"rollout/queue_depth": float(len(self.behaviors))}

    def close(self) -> None:
        self.calls.append(("close",))


class ReplayServices(ServiceFactory):
    """Builds a `ReplayService` and keeps it for the test to read."""

    built: list[ReplayService] = []

    def build(self, model_path, env, rollout, seed: int) -> RolloutService:
        service = ReplayService(model_path, seed)
        ReplayServices.built.append(service)
        return service


def test_a_second_service_named_in_the_config_trains_two_steps(tmp_path):
    ReplayServices.built.clear()
    cfg = compose_train(
        [
            f"data.service._target_={__name__}.ReplayServices",
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
        ("evaluate", 2, 8),  # the sanity validation: guess-number's two held-out secrets, rollout.eval_samples=8
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
