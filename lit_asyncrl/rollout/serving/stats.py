"""The rollout statistics a service reports each step (`rollout/*`, `dedicated/*`)."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from lit_asyncrl.envs.agent_program import AgentTask
from lit_asyncrl.envs.tools import ERROR_REASONS, ToolEnv
from lit_asyncrl.rollout.engine.protocol import Engine
from lit_asyncrl.rollout.old_logits.dedicated import DedicatedWorker
from lit_asyncrl.rollout.queue.buffer import RolloutBuffer
from lit_asyncrl.rollout.queue.producer import RolloutProducer


def rollout_stats(
    buffer: RolloutBuffer,
    lane_producers: Sequence[RolloutProducer | None],
    engines: Sequence[Engine | None],
    engine_restarts: int,
    dedicated: DedicatedWorker | None,
) -> dict[str, float]:
    """Counts from the buffer, throughput and failures from the producers (one per engine lane, None
    for a lane without one; per-lane figures with several lanes)."""
    producers = [producer for producer in lane_producers if producer is not None]
    stats = {f"rollout/{key}": float(value) for key, value in buffer.counts().items()}
    stats["rollout/queue_depth"] = stats["rollout/pending"]
    stats["rollout/in_flight_groups"] = float(sum(p.in_flight_groups for p in producers))
    stats["rollout/tokens_per_s"] = float(sum(p.tokens_per_s for p in producers))
    stats["rollout/engine_version"] = float(min((e.version for e in engines if e is not None), default=-1))
    stats["rollout/timed_out_episodes"] = float(sum(p.stats.timed_out_episodes for p in producers))
    if producers:
        stats["rollout/env_failures"] = float(sum(sum(p.stats.env_failures.values()) for p in producers))
        recent = [failed for p in producers for failed in p.stats.recent_failures]
        stats["rollout/env_failure_rate"] = sum(recent) / max(len(recent), 1)
    stats["rollout/engine_restarts"] = float(engine_restarts)
    resumed = sum(p.stats.resumed_episodes for p in producers)
    if resumed:  # after a resume: episodes in flight at the checkpoint, continued
        stats["rollout/resumed_in_flight"] = float(resumed)
    stats.update(tool_call_stats(producers))
    if any(isinstance(task, AgentTask) for producer in producers for task in producer.env.tasks().values()):
        stats["rollout/episode_segments"] = float(sum(p.stats.episode_segments for p in producers))
    if len(lane_producers) > 1:
        for lane, producer in enumerate(lane_producers):
            stats[f"rollout/engine_{lane}/in_flight_groups"] = float(producer.in_flight_groups if producer else 0)
            stats[f"rollout/engine_{lane}/groups_started"] = float(producer.groups_started if producer else 0)
    if dedicated is not None:
        producer = lane_producers[0]
        stats["dedicated/queue_depth"] = float(dedicated.queue_depth)
        stats["dedicated/scored_tokens"] = float(dedicated.scored_tokens)
        stats["dedicated/score_s"] = dedicated.score_seconds
        stats["dedicated/group_wait_s"] = producer.scoring_wait_s if producer else 0.0
    return stats


def tool_call_stats(producers: Sequence[RolloutProducer]) -> dict[str, float]:
    """A tool task's `rollout/tool_calls/<tool>`, `rollout/tool_call_errors/<reason>` and
    `rollout/tool_call_coercions/<tool>` (counts over the run: a lenient check's calls whose arguments
    were taken from strings) and `rollout/tool_calls_per_episode` (over the recent episodes); none for
    other tasks."""
    if not any(isinstance(task, ToolEnv) for producer in producers for task in producer.env.tasks().values()):
        return {}
    calls = collections.Counter()
    errors = collections.Counter(dict.fromkeys(ERROR_REASONS, 0))
    coercions = collections.Counter()
    for producer in producers:
        calls.update(producer.stats.tool_calls)
        errors.update(producer.stats.tool_call_errors)
        coercions.update(producer.stats.tool_call_coercions)
    recent = [count for producer in producers for count in producer.stats.recent_tool_calls]
    stats = {f"rollout/tool_calls/{tool}": float(count) for tool, count in sorted(calls.items())}
    stats.update({f"rollout/tool_call_errors/{reason}": float(count) for reason, count in errors.items()})
    stats.update({f"rollout/tool_call_coercions/{tool}": float(count) for tool, count in sorted(coercions.items())})
    stats["rollout/tool_calls_per_episode"] = sum(recent) / len(recent) if recent else 0.0
    return stats
