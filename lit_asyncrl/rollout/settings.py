"""The rollout side's settings, as users write them (`rollout.<key>` in Hydra): one `RolloutConfig`
made of one settings object per concern (batches, filters, engines, evaluation, failures, scale-out).

Hydra keys stay flat (`rollout.group_size=4`): `RolloutConfig.from_keys` hands each key to the part
that declares it. The Lightning CLI reaches the parts by their names (`data.rollout.batch.group_size`,
`cli_paths`). Each part checks its own values when it is made, so a bad value is refused naming its
key before anything starts. `conf/rollout/async.yaml` holds the same keys with the same defaults (a
test compares them): a new setting is a field of its part and a line there, nothing forwards it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.rollout.engine.settings import EngineSettings, require_int, require_positive
from lit_asyncrl.rollout.queue.advantages import ESTIMATORS as ADVANTAGES
from lit_asyncrl.rollout.queue.group_filter import GroupFilter


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchSettings:
    """What one training batch holds, how it is sampled, and how stale its tokens may be."""

    #: "async" (generation never waits for training) or "sync" (each batch from the latest weights).
    mode: Literal["async", "sync"] = "async"
    #: Episodes of one instance, one advantage group (GRPO).
    group_size: int = 8
    #: How a group's rewards become advantages: "grpo", "dr_grpo" or "rloo" (`queue/advantages.py`).
    advantage: str = "grpo"
    #: Groups per training batch, over all training processes together.
    groups_per_batch: int = 16
    #: A group with a token more than this many versions behind the trainer is dropped as stale.
    max_version_gap: int = 3
    #: Most episodes pending or being generated; generation waits beyond it.
    buffer_capacity: int = 256
    #: Groups generated at once, over all engines.
    max_concurrent_groups: int = 16
    #: Weights are pushed to the engines every this many optimizer steps.
    weight_sync_every: int = 1
    #: Sampling; the trainer scores with the same values (they ride in each batch).
    temperature: float = 1.0
    top_k: int = -1
    #: How long the trainer waits for a batch before failing loudly.
    batch_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for key in ("group_size", "groups_per_batch", "buffer_capacity", "max_concurrent_groups", "weight_sync_every"):
            require_int(key, getattr(self, key), 1)
        require_int("max_version_gap", self.max_version_gap, 0)
        if self.group_size * self.groups_per_batch > self.buffer_capacity:
            raise ValueError(
                f"{config_key('rollout.buffer_capacity')}={self.buffer_capacity} is smaller than one batch "
                f"({config_key('rollout.groups_per_batch')} * {config_key('rollout.group_size')} = "
                f"{self.groups_per_batch * self.group_size} episodes)"
            )
        if self.advantage not in ADVANTAGES:
            raise ValueError(
                f"{config_key('rollout.advantage')} must be one of {', '.join(ADVANTAGES)}, got {self.advantage!r}"
            )
        if self.mode not in ("async", "sync"):
            raise ValueError(f"{config_key('rollout.mode')} must be 'async' or 'sync', got {self.mode!r}")
        if self.mode == "sync" and self.weight_sync_every != 1:
            raise ValueError(
                f"{config_key('rollout.mode')}='sync' needs {config_key('rollout.weight_sync_every')}=1 "
                "(each batch from the latest weights)"
            )
        if not self.temperature > 0:
            raise ValueError(f"{config_key('rollout.temperature')} must be > 0, got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not (self.top_k == -1 or self.top_k >= 1):
            raise ValueError(
                f"{config_key('rollout.top_k')} must be -1 (no top-k) or an integer >= 1, got {self.top_k!r}"
            )
        require_positive("batch_timeout_s", self.batch_timeout_s)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GroupFilterSettings:
    """Which groups and episodes are trained on (`rollout/queue/group_filter.py`); both filters off by default."""

    #: Drop a group whose advantages are all zero (every episode got the same reward) and fill the
    #: batch from further groups (DAPO's dynamic sampling), counted as `rollout/dropped_zero_advantage`.
    filter_zero_advantage: bool = False
    #: At most this many such drops per training batch; past it a group without signal is trained on
    #: as it is, counted as `rollout/zero_advantage_kept` (a task every group fails still trains).
    max_zero_advantage_drops_per_batch: int = 16
    #: Keep episodes cut by the context or the turn limit out of the loss (`rollout/masked_overlong`).
    filter_overlong: bool = False

    def __post_init__(self) -> None:
        for key in ("filter_zero_advantage", "filter_overlong"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{config_key('rollout.' + key)} must be true or false, got {getattr(self, key)!r}")
        require_int("max_zero_advantage_drops_per_batch", self.max_zero_advantage_drops_per_batch, 0)

    def group_filter(self) -> GroupFilter:
        return GroupFilter(self.filter_zero_advantage, self.max_zero_advantage_drops_per_batch, self.filter_overlong)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSettings:
    """Held-out evaluation at each validation."""

    #: Held-out instances (fewer if the task's held-out split is smaller); never trained on.
    eval_instances: int = 32
    #: Sampled episodes per instance (n); one greedy episode is added.
    eval_samples: int = 8
    #: The k of avg@k and pass@k (pass@k: the unbiased estimator from n >= k samples).
    eval_k: int = 4
    #: Most seconds one validation chunk may take.
    eval_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        for key in ("eval_instances", "eval_k", "eval_samples"):
            require_int(key, getattr(self, key), 1)
        if self.eval_samples < self.eval_k:
            raise ValueError(
                f"{config_key('rollout.eval_samples')}={self.eval_samples} must be >= "
                f"{config_key('rollout.eval_k')}={self.eval_k} (pass@k needs n >= k samples)"
            )
        require_positive("eval_timeout_s", self.eval_timeout_s)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FailureSettings:
    """What the run survives: failing episodes and dying or stalling engines."""

    #: An episode the environment fails is dropped with that reason; above this share of failures
    #: (timeouts included) over the last `env_failure_window` episodes the run stops.
    env_failure_limit: float = 0.5
    env_failure_window: int = 64
    #: Times a dead or stalled engine is replaced by a new one with the latest weights and version
    #: (its episodes in flight dropped as "lost") before the run stops; 0 = stop at once.
    engine_restarts: int = 0
    #: Checkpoints keep the finished episodes not yet trained, and a resumed run trains them (false:
    #: they are dropped at the resume with the reason "restart" and generated anew).
    checkpoint_pending: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint_pending, bool):
            raise ValueError(
                f"{config_key('rollout.checkpoint_pending')} must be true or false, got {self.checkpoint_pending!r}"
            )
        if not 0.0 <= self.env_failure_limit <= 1.0:
            raise ValueError(
                f"{config_key('rollout.env_failure_limit')} must be in [0, 1], got {self.env_failure_limit}"
            )
        require_int("env_failure_window", self.env_failure_window, 1)
        require_int("engine_restarts", self.engine_restarts, 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScaleOutSettings:
    """How many engines, and where they (and the dedicated old-logit worker) run."""

    #: vLLM engines generating side by side; a new group goes to the least loaded one.
    num_engines: int = 1
    #: "local" (started by this process) or "ray" (each a Ray actor; needs the `ray` extra).
    placement: Literal["local", "ray"] = "local"
    #: The Ray cluster to join ("auto", "ray://host:10001"); None starts a local Ray instance.
    ray_address: str | None = None
    #: Each actor's Ray resource request (fractions share a core or a GPU).
    ray_cpus_per_engine: float = 1.0
    ray_gpus_per_engine: float = 0.0

    def __post_init__(self) -> None:
        require_int("num_engines", self.num_engines, 1)
        if self.placement not in ("local", "ray"):
            raise ValueError(f"{config_key('rollout.placement')} must be 'local' or 'ray', got {self.placement!r}")
        if not self.ray_cpus_per_engine > 0 or self.ray_gpus_per_engine < 0:
            raise ValueError(
                f"{config_key('rollout.ray_cpus_per_engine')} must be > 0 and "
                f"{config_key('rollout.ray_gpus_per_engine')} >= 0, "
                f"got {self.ray_cpus_per_engine} and {self.ray_gpus_per_engine}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """Every rollout setting, by concern (`rollout.<key>` in Hydra, flat; `data.rollout.<part>.<key>`
    in the Lightning CLI)."""

    batch: BatchSettings = BatchSettings()
    filters: GroupFilterSettings = GroupFilterSettings()
    engine: EngineSettings = EngineSettings()
    evaluation: EvalSettings = EvalSettings()
    failures: FailureSettings = FailureSettings()
    scale_out: ScaleOutSettings = ScaleOutSettings()

    @classmethod
    def from_keys(cls, **keys: Any) -> RolloutConfig:
        """The settings from the flat keys users write in Hydra (`rollout.group_size=4`): each key
        goes to the part that declares it; a key no part declares is refused by name."""
        owners = key_owners()
        unknown = sorted(key for key in keys if key not in owners)
        if unknown:
            raise ValueError(f"{', '.join(config_key('rollout.' + key) for key in unknown)}: not a rollout setting")
        by_part: dict[str, dict[str, Any]] = {part: {} for part in PARTS}
        for key, value in keys.items():
            by_part[owners[key]][key] = value
        return cls(**{part: PARTS[part](**values) for part, values in by_part.items()})


#: Each part of `RolloutConfig` and its settings class.
PARTS: dict[str, type] = {
    "batch": BatchSettings,
    "filters": GroupFilterSettings,
    "engine": EngineSettings,
    "evaluation": EvalSettings,
    "failures": FailureSettings,
    "scale_out": ScaleOutSettings,
}


def key_owners() -> dict[str, str]:
    """Each flat key (`group_size`) and the part that declares it (`batch`)."""
    return {field.name: part for part, settings in PARTS.items() for field in dataclasses.fields(settings)}


def nested_keys(keys: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Flat keys as the Lightning CLI nests them, by part (the parts without keys left out)."""
    owners = key_owners()
    nested: dict[str, dict[str, Any]] = {}
    for key, value in keys.items():
        nested.setdefault(owners[key], {})[key] = value
    return nested


def cli_paths() -> dict[str, str]:
    """Each Hydra key (`rollout.group_size`) and the Lightning CLI's path to it (`data.rollout.batch.group_size`)."""
    return {f"rollout.{key}": f"data.rollout.{part}.{key}" for key, part in key_owners().items()}
