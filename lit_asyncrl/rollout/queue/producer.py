"""Keeps the engine busy: starts advantage groups as room allows and files them in the buffer."""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import itertools
import pickle
import random
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.envs.base import Environment
from lit_asyncrl.rollout.engine.protocol import Engine
from lit_asyncrl.rollout.episodes.env_calls import EnvCaller
from lit_asyncrl.rollout.episodes.formats import EpisodeFormat
from lit_asyncrl.rollout.episodes.replay import committed_part
from lit_asyncrl.rollout.episodes.runner import EpisodeSettings, play_instance
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.old_logits.dedicated import DedicatedWorker
from lit_asyncrl.rollout.queue.advantages import AdvantageEstimator, GroupNormalized
from lit_asyncrl.rollout.queue.buffer import RolloutBuffer
from lit_asyncrl.rollout.queue.checkpointed_groups import groups_from_state, groups_to_state
from lit_asyncrl.rollout.queue.producer_stats import ProducerStats
from lit_asyncrl.rollout.records import Trajectory
from lit_asyncrl.rollout.serving.instances import TrainingDraws, training_instance

if TYPE_CHECKING:
    from lit_asyncrl.rollout.agent_endpoint.server import AgentEndpoint


@dataclasses.dataclass(frozen=True)
class ProducerSettings:
    """What a producer generates, how much of it at once, and how it shares the work with the
    producers of the other engine lanes; the service sets them for each lane.

    Attributes:
        group_size: episodes per group, all of one task instance (their advantages are relative).
        max_concurrent_groups: the most groups in flight at once (async mode's cap).
        sampling: the policy's sampling settings.
        max_context: the engine's context in tokens.
        seed: seeds the draw of task instances and of the episodes' reset seeds.
        groups_per_version: sync mode: exactly this many groups per weight version, then generation
            waits for the next version; None = async mode.
        env_failure_limit: the share of environment failures over the last `env_failure_window`
            episodes above which the run stops (`EnvironmentFailureRateError`).
        env_failure_window: how many recent episodes the failure rate and `rollout/tool_calls_per_episode`
            are taken over.
        group_ids: where group ids come from, shared by the producers of several engines (and a
            restarted engine's) so that ids never repeat; None = a count of its own from 0.
        admits: asked before each new group (with several engines only the least loaded starts it);
            None = always.
        advantages: how a group's rewards become its advantages (`rollout.advantage`).
        draws: where training instances come from, shared by the producers of several engines (a
            dataset's epochs); None = `generate_instance` with this producer's own random generator.
    """

    group_size: int
    max_concurrent_groups: int
    sampling: SamplingSettings
    max_context: int
    seed: int
    groups_per_version: int | None = None
    env_failure_limit: float = 0.5
    env_failure_window: int = 64
    group_ids: Iterator[int] | None = None
    advantages: AdvantageEstimator = dataclasses.field(default_factory=GroupNormalized)
    admits: Callable[[], bool] | None = None
    draws: TrainingDraws | None = None


class RolloutProducer:
    """Runs on the engine loop. Each group plays `settings.group_size` episodes of one task instance.

    In async mode up to `max_concurrent_groups` groups are in flight whenever the buffer has room,
    so episodes keep going across weight updates (partial rollouts). In sync mode exactly
    `groups_per_version` groups are generated per weight version, and generation then waits for
    the next version: the on-policy baseline. With a `dedicated` old-logit worker a group enters the
    buffer only once the worker has scored its tokens. An agent program's episodes call the policy
    through `agent_endpoint` (the run's, None for other tasks).
    """

    def __init__(
        self,
        engine: Engine,
        env: Environment,
        episode_formats: Mapping[str | None, EpisodeFormat],
        buffer: RolloutBuffer,
        settings: ProducerSettings,
        dedicated: DedicatedWorker | None = None,
        agent_endpoint: AgentEndpoint | None = None,
    ) -> None:
        self.engine = engine
        self.env = env
        self.episode_formats = episode_formats
        self.buffer = buffer
        self.settings = settings
        self.dedicated = dedicated
        window = settings.env_failure_window
        self.stats = ProducerStats(
            recent_failures=collections.deque(maxlen=window), recent_tool_calls=collections.deque(maxlen=window)
        )
        # This producer's own counts, which a replacement starts over.
        self.groups_started = 0
        #: Groups started in place of one the buffer's filter dropped.
        self.groups_refilled = 0
        #: Seconds the groups waited for the dedicated worker's scores.
        self.scoring_wait_s = 0.0
        #: The message of the last environment failure (the failure-rate stop quotes it).
        self.last_env_failure = ""
        #: Consecutive finished episodes without a single policy token: nothing to train on, ever.
        self.episodes_without_policy_tokens = 0
        # One thread per episode that can be in flight: a slow synchronous tool holds only its own.
        self.call_env = EnvCaller(max_workers=settings.max_concurrent_groups * settings.group_size)
        #: How every episode is played, but for its seed and recording.
        self.episode_settings = EpisodeSettings(
            call_env=self.call_env,
            sampling=settings.sampling,
            max_context=settings.max_context,
            agent_endpoint=agent_endpoint,
        )
        self.rng = random.Random(settings.seed)
        self.group_ids = settings.group_ids if settings.group_ids is not None else itertools.count()
        self.admits = settings.admits if settings.admits is not None else lambda: True
        self._in_flight: set[asyncio.Task] = set()
        # Engine version when each in-flight group started: its tokens carry this version or newer.
        self._start_versions: dict[int, int] = {}
        #: Trajectories being generated (partial), e.g. for scoring before their version goes.
        self.active: set[Trajectory] = set()
        #: Each group in flight (what a checkpoint records to continue it, `in_flight_state`).
        self._groups: dict[int, _Group] = {}
        #: Groups in flight at the checkpoint a resumed run started from, continued first.
        self.resumed_groups: list[dict] = []
        self._task: asyncio.Task | None = None
        self.error: BaseException | None = None

    def carry_counts_from(self, previous: RolloutProducer) -> None:
        """Keep the statistics of the producer this one replaces (after an engine restart); a copy:
        the stopped producer holds on to its own."""
        self.stats = copy.deepcopy(previous.stats)
        # Resumed groups the dead engine had not started yet are still owed.
        self.resumed_groups = list(previous.resumed_groups)

    def start(self) -> None:
        """Start producing (thread-safe; returns at once)."""
        if self.stats.policy_tokens == 0:  # a replacement producer keeps its predecessor's clock
            self.stats.started_at = time.monotonic()
        self.engine.loop.call_soon_threadsafe(self._start_in_loop)

    def _start_in_loop(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        """Cancel the producing loop and the groups in flight; their room goes back to the buffer."""
        try:
            self.engine.run(self._cancel_all(), timeout_s=60)
        finally:
            self.call_env.close()

    def stop_before_shutdown(self, engine_answers: bool) -> None:
        """Before its engine shuts down: `stop` where the engine's loop still answers, else only close
        the environment's pool. Never raises: the engine is shut down next anyway."""
        try:
            if engine_answers:
                self.stop()
        except Exception:  # a loop that no longer answers
            pass
        finally:
            self.call_env.close()

    async def _cancel_all(self) -> None:
        tasks = [task for task in [self._task, *self._in_flight] if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def tokens_per_s(self) -> float:
        return self.stats.policy_tokens / max(time.monotonic() - self.stats.started_at, 1e-9)

    @property
    def oldest_in_flight_version(self) -> int | None:
        """The oldest version a token of a group in flight may carry (resumed groups not restarted yet included)."""
        waiting = [oldest_recorded_version(group) for group in list(self.resumed_groups)]
        started = list(self._start_versions.values())  # list(): read from another thread
        return min([*started, *(version for version in waiting if version is not None)], default=None)

    @property
    def in_flight_groups(self) -> int:
        return len(self._in_flight)

    async def _run(self) -> None:
        started_for_version = 0
        version = self.engine.version
        refilled_before = self.groups_refilled
        try:
            while True:
                if self.engine.version != version:
                    started_for_version = 0
                    version = self.engine.version
                    refilled_before = self.groups_refilled
                # A group the buffer's filter dropped is replaced (`groups_refilled`): a synchronous
                # batch needs its number of groups from this version.
                refills = self.groups_refilled - refilled_before
                groups_per_version = self.settings.groups_per_version
                quota = None if groups_per_version is None else groups_per_version + refills
                sync_quota_used = quota is not None and started_for_version >= quota
                full = len(self._in_flight) >= self.settings.max_concurrent_groups
                if (
                    sync_quota_used
                    or full
                    or not self.admits()
                    or not self.buffer.try_reserve(self.settings.group_size)
                ):
                    await asyncio.sleep(0.005)
                    continue
                # Registered before its task first runs: a checkpoint or the trainer's release of
                # snapshots may look in between.
                group = self._new_group(self.resumed_groups.pop(0) if self.resumed_groups else None)
                task = asyncio.ensure_future(self._play_group(group))
                self._in_flight.add(task)
                task.add_done_callback(self._in_flight.discard)
                self.groups_started += 1
                started_for_version += 1
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # surfaced to the trainer by RolloutService.next_batch
            if self.error is None:
                self.error = error
            raise

    def _drop_failed(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """Episodes the environment failed leave as dropped with their reason; the group's other
        episodes are trained on (their advantages are computed among themselves)."""
        kept = []
        for trajectory in trajectories:
            # Replayed otherwise after a resume: not the environment's failure rate.
            if trajectory.env_failure == "restart":
                self.buffer.drop_produced(1, "restart")
                continue
            failure = trajectory.env_failure or ("timeout" if trajectory.timed_out else None)
            self.stats.recent_failures.append(failure is not None)
            if failure is not None:
                self.stats.env_failures[failure] += 1
                self.last_env_failure = trajectory.env_failure_message or self.last_env_failure
            if trajectory.env_failure is None:
                kept.append(trajectory)  # a timed-out episode keeps its tokens and reward
                no_tokens = trajectory.num_policy_tokens == 0
                self.episodes_without_policy_tokens = self.episodes_without_policy_tokens + 1 if no_tokens else 0
            else:
                self.buffer.drop_produced(1, trajectory.env_failure)
        return kept

    def _check_failure_rate(self) -> None:
        if self.episodes_without_policy_tokens >= NO_PROGRESS_EPISODES:
            raise NoProgressError(
                f"the last {self.episodes_without_policy_tokens} episodes ended without a single agent token: nothing "
                f"can be trained (the prompt fills the context, {config_key('rollout.max_model_len')}, "
                "or the environment ends episodes before the agent's first turn)"
            )
        window = self.stats.recent_failures
        limit = self.settings.env_failure_limit
        if len(window) == window.maxlen and sum(window) > limit * len(window):
            reasons = ", ".join(f"{reason}: {count}" for reason, count in sorted(self.stats.env_failures.items()))
            raise EnvironmentFailureRateError(
                f"{sum(window)} of the last {len(window)} episodes failed in the environment, above "
                f"{config_key('rollout.env_failure_limit')}={limit} (so far {reasons}); "
                f"last error: {self.last_env_failure}"
            )

    async def _wait_for_old_logprobs(self, episodes: list[Trajectory]) -> None:
        """Dedicated route: a group enters the buffer only with pi_old on every token."""
        start = time.monotonic()
        future = self.dedicated.submit(episodes)
        if future is not None:
            await future
        self.scoring_wait_s += time.monotonic() - start

    def _new_group(self, resumed: dict | None) -> _Group:
        """A group to play: a new instance, or one in flight at the checkpoint a resume started from
        (its finished episodes kept as they were, the others replayed and continued)."""
        if resumed is None:
            group_id = next(self.group_ids)
            if self.settings.draws is not None:
                instance = self.settings.draws.draw(self.rng, self.buffer.counts())
            else:
                instance = training_instance(self.env, self.rng, self.buffer.counts())
            seeds = [self.rng.getrandbits(31) for _ in range(self.settings.group_size)]
            recorded = [None] * self.settings.group_size
        else:
            group_id = resumed["group_id"]
            instance = pickle.loads(resumed["instance"])
            seeds = list(resumed["seeds"])
            recorded = resumed_episodes(resumed)
            self.stats.resumed_episodes += len(recorded)
        # An episode that had ended before the checkpoint is kept as it was; the others start anew.
        trajectories = [
            episode if episode is not None and episode.finished else Trajectory(group_id=group_id)
            for episode in recorded
        ]
        versions = [
            self.engine.version,
            *(episode.oldest_version for episode in recorded if episode and episode.num_policy_tokens),
        ]
        self._start_versions[group_id] = min(versions)
        group = _Group(group_id, instance, seeds, trajectories, recorded)
        self._groups[group_id] = group
        self.active.update(trajectories)
        return group

    async def _play_group(self, group: _Group) -> None:
        """Play one group, attach advantages and file it; any failure is kept for the trainer."""
        group_id = group.group_id
        trajectories = group.trajectories
        filed = False
        try:
            episodes = []
            for trajectory, seed, recorded in zip(trajectories, group.seeds, group.recorded):
                if not trajectory.finished:
                    settings = dataclasses.replace(self.episode_settings, seed=seed, recorded=recorded)
                    episodes.append(
                        play_instance(self.engine, self.env, self.episode_formats, group.instance, trajectory, settings)
                    )
            await asyncio.gather(*episodes)
            self._groups.pop(group_id, None)  # played: from here on no checkpoint records it in flight
            self.stats.timed_out_episodes += sum(trajectory.timed_out for trajectory in trajectories)
            for trajectory in trajectories:
                self.stats.tool_calls.update(trajectory.tool_calls)
                self.stats.tool_call_errors.update(trajectory.tool_call_errors)
                self.stats.tool_call_coercions.update(trajectory.tool_call_coercions)
                self.stats.recent_tool_calls.append(sum(trajectory.tool_calls.values()))
            kept = self._drop_failed(trajectories)
            if kept:
                # An agent program's episode may be several segments (`Trajectory.later_segments`): filed
                # side by side with the episode's advantage, taken over episodes, not segments.
                segments = [segment for trajectory in kept for segment in trajectory.segments]
                if self.dedicated is not None:
                    await self._wait_for_old_logprobs(segments)
                for trajectory, advantage in zip(kept, self.settings.advantages([t.reward for t in kept])):
                    for segment in trajectory.segments:
                        segment.advantage = advantage
                    trajectory.later_segments = []  # filed side by side from here on, each once
                self.stats.policy_tokens += sum(segment.num_policy_tokens for segment in segments)
                self.stats.episode_segments += len(segments) - len(kept)
                if not self.buffer.put_group(segments, reserved=self.settings.group_size):
                    self.groups_refilled += 1
            else:
                self.buffer.release(self.settings.group_size, group_id)
            filed = True
            self._check_failure_rate()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # kept for the trainer thread, which raises it (RolloutService.next_batch)
            if self.error is None:  # the first failure is the cause; later ones are its echoes
                self.error = error
        finally:
            if not filed:
                self.buffer.release(self.settings.group_size)
            self.active.difference_update(trajectories)
            self._start_versions.pop(group_id, None)
            self._groups.pop(group_id, None)

    def in_flight_state(self) -> list[dict]:
        """The groups in flight, as a checkpoint keeps them (call on the engine loop, which owns them):
        group id, instance (pickled), reset seeds and each episode up to its last final token.
        Continued by a resumed run (`resumed_groups`), their answered turns replayed (`episode_replay.py`)."""
        states = []
        for group in self._groups.values():
            try:
                instance = pickle.dumps(group.instance)
            except Exception as error:  # generated anew after a resume
                warnings.warn(
                    f"a group's instance cannot be pickled ({error!r}): it is not in this checkpoint", stacklevel=2
                )
                continue
            episodes = [committed_part(trajectory) for trajectory in group.trajectories]
            states.append(
                {
                    "group_id": group.group_id,
                    "instance": instance,
                    "seeds": list(group.seeds),
                    "episodes": groups_to_state([episodes])[0],
                }
            )
        return states + list(self.resumed_groups)  # those not restarted yet are still owed


def oldest_recorded_version(group: dict) -> int | None:
    """The oldest version among a recorded group's sampled tokens (None: none sampled yet)."""
    versions = [
        v for episode in group["episodes"] for v, sampled in zip(episode["versions"], episode["loss_mask"]) if sampled
    ]
    return min(versions, default=None)


@dataclasses.dataclass
class _Group:
    """A group in flight: its instance, each episode's reset seed, its trajectories and, for a
    resumed group, each episode as the checkpoint recorded it."""

    group_id: int
    instance: object
    seeds: list[int]
    trajectories: list[Trajectory]
    recorded: list[Trajectory | None]


def resumed_episodes(resumed: dict) -> list[Trajectory]:
    """A recorded group's episodes, to replay and continue."""
    return groups_from_state([resumed["episodes"]])[0]


#: Consecutive episodes without a policy token after which a run is declared unable to progress.
NO_PROGRESS_EPISODES = 64


class NoProgressError(RuntimeError):
    """Episodes keep ending without a policy token: the run can never train."""


class EnvironmentFailureRateError(RuntimeError):
    """Too many episodes of the recent window failed in the environment: the run stops."""
