"""The rollout service: the one protocol between training (Lightning) and generation (vLLM).

Everything on the generation side (engine, episode runner, producer, buffer, dedicated old-logit
worker) sits behind `RolloutService`. The Lightning side only ever talks to this protocol: the
`RolloutDataModule` adapts it to a dataloader, `EngineWeightSync` publishes weights through it,
the interruption-sync and snapshot routes pause it, score through it or ask it which versions are
still alive, and `RolloutStatsLogger` logs its `stats()`. Scale-out sits behind it too, never in the
module: several engines and engines in Ray actors inside `VLLMRolloutService`, and
`RankZeroRollouts` (this protocol on every DDP rank, served by rank 0's service).

Batch schema (what `next_batch` returns; the module trains on any source that yields it):

    input_ids          long  [B, T]  prompt, agent and environment tokens, right-padded
    attention_mask     long  [B, T]
    loss_mask          bool  [B, T]  True on tokens the policy sampled
    behavior_logprobs  float [B, T]  mu: the engine's log-prob of each sampled token (0 elsewhere)
    versions           long  [B, T]  weight version that sampled each token (-1 elsewhere)
    old_logprobs       float [B, T]  exact pi_old where a route attached it (NaN = not scored)
    advantages         float [B, T]  group-normalised advantage of each episode, on its policy tokens
    rewards            float [B]     episode return
    success            float [B]     1.0 where the episode solved its task
    episode_s          float [B]     wall seconds of each episode (environment latency included)
    group_ids          long  [B]     advantage group of each episode
    temperature        float         sampling temperature (the trainer scores with the same)
    top_k              int           sampling top-k (-1 = off)

A mixture of tasks (`TaskMix`) adds, in training and evaluation batches alike:

    task_ids           long  [B]     the task of each episode (evaluation: of each instance), an index into
    task_names         tuple[str]    every task of the mixture, the same tuple in every batch

A dataset task's reward functions (`env=dataset`) add to training batches, per function `<name>`:

    reward_value/<name>   float64 [B]  the function's value for each episode (NaN where it scored none)
    reward_failed/<name>  float64 [B]  how often it raised on each episode
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from lit_asyncrl.envs.base import Environment
    from lit_asyncrl.rollout.settings import RolloutConfig
    from lit_asyncrl.rollout.weights.route import WeightPush

#: `score_fn(input_ids [b, T], attention_mask [b, T]) -> logits [b, T, V]`: the weights to score with.
ScoreFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class RolloutServiceError(RuntimeError):
    """A part of the rollout service died or failed; the message names the part."""


@runtime_checkable
class RolloutService(Protocol):
    """Generation as a service: start it, take batches, publish weights, close it.

    Every method is called from the trainer's thread. `close` is idempotent and must leave no
    process, thread or temp file of the service behind, whatever state it is in.
    """

    #: Groups with a token more than this many versions behind the trainer are dropped as stale.
    max_version_gap: int
    #: Weights are published every this many optimizer steps (1 = every step).
    weight_sync_every: int
    #: Advantage groups in one training batch, over all training processes together.
    groups_per_batch: int

    def configure(self, world_size: int, rank: int) -> RolloutService:
        """The service as training process `rank` of `world_size` uses it; called once the
        trainer's world size is known, before `start`. Several processes share one service (on rank 0)."""

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the service (its accounting: produced = trained + dropped + pending,
        and the pending episodes when it keeps them: then it has `checkpoint_pending = True`, which
        tells the snapshot reference to checkpoint the snapshots they need)."""

    def load_state_dict(self, state: dict) -> None:
        """Take back what `state_dict` gave, before `start`."""

    def launch_early(self) -> None:
        """Begin slow set-up (the engine's start) in the background, before `start`; may do nothing."""

    def start(self, weights: Mapping[str, torch.Tensor], version: int, train: bool = True) -> None:
        """Load `weights` as `version` and start generating (`train=False`: evaluation only, no training rollouts)."""

    def next_batch(self, timeout_s: float) -> dict:
        """Block until a training batch (schema above) is ready; raise `RolloutServiceError` if a part died."""

    def publish_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> WeightPush | None:
        """Move generation to `version`; what the push took (None when no push was due at `version`)."""

    def live_versions(self) -> list[int]:
        """Weight versions that a token not yet trained on may carry (pending or being generated)."""

    def pause(self) -> None:
        """Stop sampling new tokens; in-flight episodes are kept and continue after `resume`."""

    def resume(self) -> None:
        """Let generation continue (a weight push resumes it too)."""

    def score_unscored(self, score_fn: ScoreFn, version: int) -> int:
        """Attach pi_old from `score_fn` to every token of `version` still lacking it; returns how many.

        Call while paused, before `version`'s weights are replaced.
        """

    def evaluate(self, instances: Sequence[Any], samples: int, timeout_s: float) -> dict[str, torch.Tensor]:
        """Play `samples` sampled episodes and one greedy episode of each instance with the weights
        generation uses now, outside the training buffer and its accounting.

        Returns `success` float [N, samples], `rewards` float [N, samples] and `greedy_success` float [N]
        (for a mixture of tasks also `task_ids` [N] and `task_names`).
        """

    def stats(self) -> dict[str, float]:
        """Queue, accounting (produced = trained + dropped + pending) and throughput, by metric name."""

    def close(self) -> None:
        """Stop everything the service started (engine, threads, worker processes, temp files)."""


@runtime_checkable
class DedicatedWorkerHost(Protocol):
    """A rollout service that can score pi_old in a dedicated worker (`reference=dedicated`)."""

    def use_dedicated_worker(self) -> None:
        """Score pi_old in a dedicated worker while each version is alive (call before `start`)."""


def require_service(rollouts: RolloutService | None, who: str) -> RolloutService:
    """`rollouts`, or an error naming `who` when the fit has no rollout service."""
    if rollouts is None:
        raise TypeError(
            f"{who} needs a rollout service: fit with a datamodule whose `rollouts` implements "
            "lit_asyncrl.rollout.service.RolloutService"
        )
    return rollouts


class ServiceFactory(ABC):
    """Builds the rollout service a run trains from (`data.service` in the configs).

    A second implementation of `RolloutService` is a subclass whose `build` returns it, named in the
    config (`data.service._target_` in Hydra, `data.service.class_path` in the Lightning CLI);
    nothing else changes. `build` only checks and prepares: nothing starts before `start`.
    """

    @abstractmethod
    def build(self, model_path: str | Path, env: Environment, rollout: RolloutConfig, seed: int) -> RolloutService:
        """The service for the model folder `model_path`, the task `env` and the settings `rollout`."""
