"""Rollout records: one trajectory per episode, with a weight version on every policy token."""

from __future__ import annotations

import collections
import dataclasses
import math

import torch

#: Version recorded for tokens the policy did not sample (prompt, environment observations).
NO_VERSION = -1


@dataclasses.dataclass(eq=False)  # identity semantics: trajectories are tracked in sets while generated
class Trajectory:
    """A whole multi-turn episode as one token sequence.

    `loss_mask[t]` is True where token t was sampled by the policy; those tokens carry the
    behaviour log-prob mu (`behavior_logprobs[t]`) and the weight version that sampled them.
    Observation tokens are in the context but never in the loss.
    """

    group_id: int
    token_ids: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[bool] = dataclasses.field(default_factory=list)
    behavior_logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    num_turns: int = 0
    #: The episode hit the environment's `episode_timeout_s` (it keeps the reward it had).
    timed_out: bool = False
    #: Wall seconds from the episode's reset to its end (environment latency included).
    duration_s: float = 0.0
    #: Why the environment failed this episode ("env_error": a call raised, "env_malformed": an
    #: answer that is not a Transition or not encodable), None when it did not; with the error.
    env_failure: str | None = None
    env_failure_message: str = ""
    advantage: float = 0.0
    #: Exact training-side pi_old per token, filled by the interruption-sync and dedicated routes
    #: (NaN until scored), with the version whose weights scored it.
    old_logprobs: list[float] = dataclasses.field(default_factory=list)
    old_versions: list[int] = dataclasses.field(default_factory=list)
    #: Tokens whose pi_old was computed under another version than the one that sampled them
    #: (a pause/stream race); their pi_old was reset to NaN so the loss drops and counts them.
    misattributed_scores: int = 0
    #: The task of a mixture that played the episode (None for a single task).
    task: str | None = None
    #: Where the runner cut the episode: "context" (no room left in rollout.max_model_len) or
    #: "turns" (env.max_turns reached); None when the environment ended it (or it timed out).
    cut_off: str | None = None
    #: False keeps the episode out of the loss (its tokens masked in the batch): `GroupFilter.overlong`.
    in_loss: bool = True
    #: A tool task's calls by tool, its calls answered with an error by reason, and its calls whose
    #: arguments a lenient check took from strings by tool (`envs/tools`).
    tool_calls: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    tool_call_errors: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    tool_call_coercions: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: A dataset task's reward functions (`envs/dataset_task`): each one's value summed over the
    #: episode's steps (NaN while it scored none of them), and how often each raised.
    reward_terms: dict[str, float] = dataclasses.field(default_factory=dict)
    reward_failures: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    #: Where each agent turn starts, the tokens whose values are final (the prompt, the answered
    #: turns with their final versions, the observations: what a checkpoint records of an episode
    #: in flight, `episode_replay.py`), and whether the episode ended.
    turn_starts: list[int] = dataclasses.field(default_factory=list)
    committed: int = 0
    finished: bool = False
    #: An agent program's episode (`rollout/agent_endpoint`) whose calls did not all continue one
    #: conversation: its other segments, each exact on its own, in the order they were opened. The
    #: producer files them beside this one (same reward and advantage); never checkpointed in here.
    later_segments: list[Trajectory] = dataclasses.field(default_factory=list)
    #: With `rollout.capture_routing` (a mixture-of-experts policy), the experts the engine routed each
    #: position to under each weight version that computed it: version -> [positions, layers, top_k] (int16,
    #: -1 where that version computed none). Routing replay's input (`record_routing`).
    routed_experts: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)

    def record_step_info(self, info: dict) -> None:
        """Add what one step's `info` reports: a tool task's calls, errors and leniently taken arguments
        (`tool_calls`, `tool_call_errors`, `tool_call_coercions`), a dataset task's reward-function values
        and failures (`rewards`, `reward_failures`)."""
        self.tool_calls.update(info.get("tool_calls", {}))
        self.tool_call_errors.update(info.get("tool_call_errors", {}))
        self.tool_call_coercions.update(info.get("tool_call_coercions", {}))
        for name, value in info.get("rewards", {}).items():
            earlier = self.reward_terms.get(name, math.nan)
            if value is None:
                self.reward_terms[name] = earlier
            else:
                self.reward_terms[name] = float(value) + (0.0 if math.isnan(earlier) else earlier)
        self.reward_failures.update(info.get("reward_failures", []))

    def extend_context(self, token_ids: list[int]) -> None:
        """Append tokens the policy did not write (prompt or observation)."""
        self.token_ids += token_ids
        self.loss_mask += [False] * len(token_ids)
        self.behavior_logprobs += [0.0] * len(token_ids)
        self.versions += [NO_VERSION] * len(token_ids)
        self.old_logprobs += [0.0] * len(token_ids)
        self.old_versions += [NO_VERSION] * len(token_ids)

    def extend_policy(self, token_ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        """Append tokens sampled by the policy, with their mu and versions."""
        if not len(token_ids) == len(logprobs) == len(versions):
            raise ValueError("token_ids, logprobs and versions must have the same length")
        self.token_ids += token_ids
        self.loss_mask += [True] * len(token_ids)
        self.behavior_logprobs += logprobs
        self.versions += versions
        self.old_logprobs += [math.nan] * len(token_ids)
        self.old_versions += [NO_VERSION] * len(token_ids)

    def set_versions(self, start: int, versions: list[int]) -> int:
        """Overwrite the versions of policy tokens from `start` (the engine's final spans of a turn).

        A token already scored under another version than the one that sampled it loses its
        pi_old (set back to NaN, so the loss masks and counts it); returns how many did.
        """
        invalidated = 0
        for offset, version in enumerate(versions):
            position = start + offset
            self.versions[position] = version
            if self.old_versions[position] not in (NO_VERSION, version):
                self.old_logprobs[position] = math.nan
                self.old_versions[position] = NO_VERSION
                invalidated += 1
        return invalidated

    def record_routing(self, routing: dict[int, torch.Tensor]) -> None:
        """Add what a turn's request recorded: per weight version, the experts of the positions it computed under
        that version ([positions, layers, top_k] from the episode's first position on, -1 elsewhere).

        Each version keeps its own routing: a token was sampled from positions computed under its version, and a
        weight push computes the earlier positions again under the next version, whose routers may choose
        otherwise. Within one version, a position computed again (a later turn that missed the prefix cache)
        takes the later routing: the one every token after it attended to."""
        for version, recorded in routing.items():
            earlier = self.routed_experts.get(version)
            self.routed_experts[version] = recorded if earlier is None else _overlaid(earlier, recorded)

    def unscored_positions(self) -> list[int]:
        """Policy-token positions that have no pi_old yet."""
        return [
            i for i, (sampled, old) in enumerate(zip(self.loss_mask, self.old_logprobs)) if sampled and math.isnan(old)
        ]

    @property
    def policy_versions(self) -> list[int]:
        return [version for version, sampled in zip(self.versions, self.loss_mask) if sampled]

    @property
    def oldest_version(self) -> int:
        return min(self.policy_versions, default=NO_VERSION)

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def segments(self) -> list[Trajectory]:
        """This trajectory and its `later_segments`: what the episode trains on."""
        return [self, *self.later_segments]


def _overlaid(earlier: torch.Tensor, later: torch.Tensor) -> torch.Tensor:
    """`earlier` [positions, layers, top_k] with `later`'s routing wherever `later` recorded one."""
    merged = torch.full((max(len(earlier), len(later)), *later.shape[1:]), -1, dtype=later.dtype)
    merged[: len(earlier)] = earlier
    recorded = (later >= 0).all(dim=-1, keepdim=True)
    merged[: len(later)] = torch.where(recorded, later, merged[: len(later)])
    return merged


def task_columns(trajectories: list[Trajectory], task_names: tuple[str, ...]) -> dict:
    """A mixture's batch columns: each row's task as an index into `task_names` (`task_ids` [B]) and
    the names themselves, the same tuple in every batch so that every rank knows every task."""
    return {
        "task_ids": torch.tensor([task_names.index(t.task) for t in trajectories], dtype=torch.long),
        "task_names": task_names,
    }


#: Batch column prefixes of a dataset task's reward functions (`reward_term_columns`).
REWARD_VALUE = "reward_value/"
REWARD_FAILED = "reward_failed/"


def training_batch(
    trajectories: list[Trajectory], pad_id: int, task_names: tuple[str, ...], temperature: float, top_k: int
) -> dict:
    """A training batch as `RolloutService.next_batch` hands it out: the collated tensors, a
    mixture's task columns, and the sampling settings the log-probs are computed under."""
    batch = collate(trajectories, pad_id=pad_id)
    if task_names:
        batch.update(task_columns(trajectories, task_names))
    batch.update(reward_term_columns(trajectories))
    batch["temperature"] = temperature
    batch["top_k"] = top_k
    return batch


def reward_term_columns(trajectories: list[Trajectory]) -> dict[str, torch.Tensor]:
    """A dataset task's reward functions per episode, a column [B] each: `reward_value/<name>` (NaN
    where the function scored no step) and `reward_failed/<name>` (how often it raised); nothing for
    episodes of other tasks. One-dimensional, so a batch split over DDP ranks splits them by row."""
    names = sorted({name for t in trajectories for name in (*t.reward_terms, *t.reward_failures)})
    columns = {}
    for name in names:
        values = [t.reward_terms.get(name, math.nan) for t in trajectories]
        columns[f"{REWARD_VALUE}{name}"] = torch.tensor(values, dtype=torch.float64)
        failures = [float(t.reward_failures[name]) for t in trajectories]
        columns[f"{REWARD_FAILED}{name}"] = torch.tensor(failures, dtype=torch.float64)
    return columns


def collate(trajectories: list[Trajectory], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad trajectories into [B, T] tensors; advantages are broadcast onto policy tokens."""
    length = max(len(trajectory.token_ids) for trajectory in trajectories)

    def padded(values: list, fill, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([row + [fill] * (length - len(row)) for row in values], dtype=dtype)

    in_loss = torch.tensor([t.in_loss for t in trajectories], dtype=torch.bool)  # [B]
    loss_mask = padded([t.loss_mask for t in trajectories], False, torch.bool) & in_loss[:, None]  # [B, T]
    advantages = torch.tensor([t.advantage for t in trajectories], dtype=torch.float32)  # [B]
    routing = _routing_columns(trajectories, length)
    return {
        **routing,
        "input_ids": padded([t.token_ids for t in trajectories], pad_id, torch.long),
        "attention_mask": padded([[1] * len(t.token_ids) for t in trajectories], 0, torch.long),
        "loss_mask": loss_mask,
        "behavior_logprobs": padded([t.behavior_logprobs for t in trajectories], 0.0, torch.float32),
        "old_logprobs": padded([t.old_logprobs for t in trajectories], 0.0, torch.float32),
        "versions": padded([t.versions for t in trajectories], NO_VERSION, torch.long),
        "advantages": advantages[:, None] * loss_mask,
        "rewards": torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        "success": torch.tensor([t.success for t in trajectories], dtype=torch.float32),
        "episode_s": torch.tensor([t.duration_s for t in trajectories], dtype=torch.float32),
        "group_ids": torch.tensor([t.group_id for t in trajectories], dtype=torch.long),
    }


def _routing_columns(trajectories: list[Trajectory], length: int) -> dict[str, torch.Tensor]:
    """When an episode of the batch carries a routing: `routed_experts` [B, T, S, layers, top_k], a position's
    recorded routing under each weight version that computed it (S: the most versions of a row; -1 where a
    slot holds none), and `routed_experts_versions` [B, T, S], the version each slot's routing was computed
    under (NO_VERSION where the slot holds none). Per position, so a split by rows and length keeps them whole.
    Nothing when no episode carries a routing."""
    recorded = [routing for t in trajectories for routing in t.routed_experts.values()]
    if not recorded:
        return {}
    slots = max(len(t.routed_experts) for t in trajectories)
    experts = torch.full((len(trajectories), length, slots, *recorded[0].shape[1:]), -1, dtype=torch.int16)
    versions = torch.full((len(trajectories), length, slots), NO_VERSION, dtype=torch.long)
    for row, trajectory in enumerate(trajectories):
        for slot, version in enumerate(sorted(trajectory.routed_experts)):
            routing = trajectory.routed_experts[version][:length]
            experts[row, : len(routing), slot] = routing
            computed = (routing >= 0).flatten(start_dim=1).any(dim=1)
            versions[row, : len(routing), slot] = torch.where(computed, version, NO_VERSION)
    return {"routed_experts": experts, "routed_experts_versions": versions}
