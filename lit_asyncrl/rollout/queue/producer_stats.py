"""What a producer counts over a run (`rollout/*`): failures, tool calls, throughput, resumed work."""

from __future__ import annotations

import collections
import dataclasses
import time


@dataclasses.dataclass
class ProducerStats:
    """A producer's statistics over the run (`rollout/*`): the producer that replaces it after an
    engine restart carries them on (`RolloutProducer.carry_counts_from`).

    Attributes:
        recent_failures: whether each of the last `env_failure_window` episodes failed in the
            environment (timeouts included), the failure rate's window.
        recent_tool_calls: a tool task's calls in each of the last `env_failure_window` episodes.
        env_failures: episodes failed in the environment, by reason ("env_error", "env_malformed",
            "timeout").
        tool_calls: a tool task's calls, by tool.
        tool_call_errors: a tool task's failed calls, by reason.
        tool_call_coercions: a tool task's calls whose arguments a lenient check took from strings, by tool.
        timed_out_episodes: episodes that outlived the environment's `episode_timeout_s`.
        policy_tokens: agent tokens of the groups filed (the throughput's numerator).
        started_at: when generation started (`time.monotonic()`; the throughput's clock).
        resumed_episodes: episodes in flight at the checkpoint a resumed run started from, continued.
        episode_segments: agent programs' segments filed beyond one per episode (calls that did not
            continue their episode's conversation, `rollout/agent_endpoint`).
    """

    recent_failures: collections.deque[bool]
    recent_tool_calls: collections.deque[int]
    env_failures: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    tool_calls: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    tool_call_errors: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    tool_call_coercions: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    timed_out_episodes: int = 0
    policy_tokens: int = 0
    started_at: float = dataclasses.field(default_factory=time.monotonic)
    resumed_episodes: int = 0
    episode_segments: int = 0
