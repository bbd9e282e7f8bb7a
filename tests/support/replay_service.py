"""A second `RolloutService` and its factory (for a config's `data.service._target_`): it replays one
hand-made batch (`batches.make_batch`), its mu scored by the service itself with the weights it was last
given, and records every call. No engine starts."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from lit_asyncrl.rollout.service import RolloutService, ServiceFactory
from lit_asyncrl.scoring import token_logprobs
from tests.support.batches import TEMPERATURE, TOP_K, all_version, make_batch


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

    def publish_weights(self, weights, version: int) -> None:
        self.calls.append(("publish", version))
        self._load(weights, version)

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
