"""`RolloutService` on in-process vLLM engines: engines, their producers, one buffer, dedicated worker."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.envs.agent_program import AgentTask, ExternalAgentEnv
from lit_asyncrl.envs.base import Environment
from lit_asyncrl.rollout.agent_endpoint.server import AgentEndpoint
from lit_asyncrl.rollout.engine.protocol import Engine, EngineDeadError
from lit_asyncrl.rollout.engine.settings import EngineSettings, parallelism_args
from lit_asyncrl.rollout.episodes.for_task import episode_formats_for
from lit_asyncrl.rollout.episodes.sampling import SamplingSettings
from lit_asyncrl.rollout.old_logits.dedicated import DedicatedWorker
from lit_asyncrl.rollout.old_logits.scoring import score_unscored_on
from lit_asyncrl.rollout.queue.advantages import ESTIMATORS as ADVANTAGES
from lit_asyncrl.rollout.queue.buffer import RolloutBuffer
from lit_asyncrl.rollout.queue.checkpointed_groups import in_flight_groups, next_group_id, not_settled, resumable
from lit_asyncrl.rollout.queue.producer import ProducerSettings, RolloutProducer
from lit_asyncrl.rollout.records import Trajectory, training_batch
from lit_asyncrl.rollout.service import RolloutService, RolloutServiceError, ScoreFn
from lit_asyncrl.rollout.serving.distributed import RankZeroRollouts, check_batch_splits
from lit_asyncrl.rollout.serving.frozen_engines import start_frozen_engine
from lit_asyncrl.rollout.serving.held_out import HeldOutEvaluator
from lit_asyncrl.rollout.serving.instances import TrainingDraws
from lit_asyncrl.rollout.serving.lanes import EngineLanes, lane_share
from lit_asyncrl.rollout.serving.placement import placement_factories
from lit_asyncrl.rollout.serving.startup_checks import check_context_holds_a_turn, check_tokenizer_fits_model
from lit_asyncrl.rollout.serving.stats import rollout_stats
from lit_asyncrl.rollout.settings import RolloutConfig
from lit_asyncrl.rollout.weights.choice import check_changed_elements, route_for_policy, trainer_device_type
from lit_asyncrl.rollout.weights.route import WeightPush, pushed_one_after_another
from lit_asyncrl.text import pad_token_id


class VLLMRolloutService:
    """Generation on `num_engines` background vLLM `AsyncLLM`s in this process (see `RolloutService`).

    Each engine has its own producer; all producers fill one shared buffer, so accounting and the
    staleness cap are global. A new group starts on the least loaded engine (`LeastLoadedRouter`)
    and stays there. Every published version is pushed to every engine; each token carries the
    version of the engine that sampled it, so per-token versions stay exact across engines.

    Nothing expensive happens before `start`: the constructor only checks its arguments and loads
    the tokenizer. `close` stops the producers, the dedicated worker and the engines (their
    processes, threads and temp dirs) in that order, whatever state they are in.

    Args:
        model_path: a local Hugging Face model folder the engines serve.
        env: the task; episodes of one instance form a group of `rollout.group_size` (GRPO advantages).
        rollout: every rollout setting (`RolloutConfig`: batches, engines, evaluation, failures, placement).
        seed: task instances are drawn from this seed (and each engine samples from it).
        liveness_poll_s: how often a waiting `next_batch` checks that every part is alive.
    """

    def __init__(
        self,
        model_path: str | Path,
        env: Environment,
        rollout: RolloutConfig,
        *,
        seed: int,
        liveness_poll_s: float = 0.5,
    ) -> None:
        from transformers import AutoTokenizer

        self.model_path = str(model_path)
        self.env = env
        self.rollout = rollout
        # What the `RolloutService` protocol declares, and what the snapshot reference reads; every
        # other setting is read from `self.rollout` where it is used.
        self.groups_per_batch = rollout.batch.groups_per_batch
        self.max_version_gap = rollout.batch.max_version_gap
        self.weight_sync_every = rollout.batch.weight_sync_every
        self.checkpoint_pending = rollout.failures.checkpoint_pending
        self.seed = seed
        # One trainer process assumed until `configure` says otherwise, so that a route this
        # machine cannot take is refused now, before anything starts.
        self.engine_settings = self._engine_settings(trainer_processes=1)
        # vLLM's parallelism, checked where it will run (a Ray actor checks its own).
        if rollout.scale_out.placement == "local":
            parallelism_args(self.engine_settings, trainer_device_type())
        self.engine_factory, self.dedicated_worker_factory = placement_factories(rollout.scale_out)
        self.liveness_poll_s = liveness_poll_s
        self.engine_restarts = 0
        self._weights: Mapping[str, torch.Tensor] = {}
        self._version = 0
        self._train = True
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        # Made here, before any engine starts: an unusable chat template or stop text fails fast.
        self.episode_formats = episode_formats_for(self.tokenizer, env)
        #: A mixture's task names (batches say which task played each row); () for a single task.
        self.task_names = tuple(name for name in env.tasks() if name is not None)
        self.pad_id = pad_token_id(self.tokenizer)
        check_tokenizer_fits_model(self.model_path, self.tokenizer)
        for name, task in env.tasks().items():
            if not isinstance(task, AgentTask):  # an agent program's first prompt is its own to send
                check_context_holds_a_turn(task, self.episode_formats[name], rollout.engine.max_model_len, seed)
        self.buffer = RolloutBuffer(
            rollout.batch.buffer_capacity, rollout.batch.max_version_gap, rollout.filters.group_filter()
        )
        sampling = SamplingSettings(temperature=rollout.batch.temperature, top_k=rollout.batch.top_k)
        agent_tasks = [task for task in env.tasks().values() if isinstance(task, AgentTask)]
        connection_files = [task.connection_file for task in agent_tasks if isinstance(task, ExternalAgentEnv)]
        #: The chat endpoint agent programs call (started with the engines), None without such a task.
        self.agent_endpoint = (
            AgentEndpoint(self.tokenizer, sampling, connection_files[0] if connection_files else None)
            if agent_tasks
            else None
        )
        self.evaluator = HeldOutEvaluator(
            env, self.episode_formats, sampling, rollout.engine.max_model_len, self.task_names, self.agent_endpoint
        )
        self.lanes = EngineLanes(rollout.scale_out.num_engines, self._new_engine)
        self._group_ids = itertools.count()
        #: Training instances, shared by the lanes' producers: a dataset's rows in epochs, from `seed`.
        self.training_draws = TrainingDraws(env, seed)
        # Set while a checkpoint reads what is in flight: no group starts, so none has drawn its
        # instance (moved an epoch's position) without being in the checkpoint.
        self._reading_checkpoint = threading.Event()
        self._resumed: list[dict] = []  # groups in flight at the checkpoint a resume started from
        self.dedicated: DedicatedWorker | None = None
        self._use_dedicated = False

    def _engine_settings(self, trainer_processes: int) -> EngineSettings:
        """The engines' settings, their weight route chosen for this machine and `trainer_processes`."""
        engine = self.rollout.engine
        placement = self.rollout.scale_out.placement
        route = route_for_policy(engine, trainer_device_type(), placement, trainer_processes, self.model_path)
        check_changed_elements(engine.push_changed_elements, route)
        return dataclasses.replace(engine, weight_transfer=route)

    def configure(self, world_size: int, rank: int) -> RolloutService:
        """With several training processes, rank 0's service serves them all (`RankZeroRollouts`)."""
        self.engine_settings = self._engine_settings(trainer_processes=world_size)
        if world_size == 1:
            return self
        check_batch_splits(self.groups_per_batch, world_size)
        return RankZeroRollouts(self, rank=rank, world_size=world_size)

    def state_dict(self) -> dict:
        self._reading_checkpoint.set()
        try:
            # Groups in flight first: one may be filed before the buffer is read (the trainer takes none meanwhile).
            in_flight = (
                in_flight_groups(self.lanes.engines, self.lanes.producers) + self._resumed
                if self.checkpoint_pending
                else []
            )
            draws = self.training_draws.state_dict()
        finally:
            self._reading_checkpoint.clear()
        accounting = self.buffer.state_dict(keep_pending=self.checkpoint_pending)
        return {
            "accounting": accounting,
            "in_flight": not_settled(in_flight, self.buffer.settled_groups()),
            "training_draws": draws,
        }

    def load_state_dict(self, state: dict) -> None:
        restored = self.buffer.load_state_dict(state["accounting"], keep_pending=self.checkpoint_pending)
        # The groups in flight at the checkpoint: lane 0 continues them.
        self._resumed = (
            resumable(state.get("in_flight", []), self.rollout.batch.group_size) if self.checkpoint_pending else []
        )
        self.buffer.resumed([group["group_id"] for group in self._resumed])
        self._group_ids = itertools.count(next_group_id(restored, self._resumed))  # a batch tells groups apart by id
        self.training_draws.load_state_dict(state.get("training_draws", {}))

    @property
    def engine(self) -> Engine | None:
        """The first engine (the only one with `num_engines=1`)."""
        return self.lanes.engines[0]

    @property
    def started(self) -> bool:
        return self.lanes.started

    # -- lifecycle --------------------------------------------------------------------------
    def use_dedicated_worker(self) -> None:
        if self.started:
            raise RuntimeError("use_dedicated_worker() must be called before start()")
        if self.rollout.scale_out.num_engines != 1:
            # The worker attaches its scores on one engine's loop, where that engine's trajectories live.
            raise ValueError(
                f"reference=dedicated runs with {config_key('rollout.num_engines')}=1, "
                f"got {self.rollout.scale_out.num_engines}"
            )
        self._use_dedicated = True

    def launch_early(self) -> None:
        """Begin the engines' start now, in the background; `start` waits for them and loads their weights.

        An engine's initial weights (the model folder's) never sample: `start` replaces them
        with the trainer's before the first request, so launching before the warm start is safe.
        """
        self.lanes.launch_early()

    def _new_engine(self, initial_version: int) -> Engine:
        """A launched engine (not yet serving) on the current engine settings."""
        # Adapters as versions: the versions a request in flight may still run under, and the newest.
        max_loras = self.rollout.batch.max_version_gap + 2
        engine = self.engine_factory(self.model_path, self.engine_settings, seed=self.seed, max_loras=max_loras)
        engine.launch(initial_version=initial_version)
        return engine

    def start(self, weights: Mapping[str, torch.Tensor], version: int, train: bool = True) -> None:
        if self.started:
            raise RuntimeError("the rollout service is already started")
        self._weights = weights
        self._version = version
        self._train = train
        try:
            # Every engine launched before any is waited for: their starts overlap.
            self.launch_early()
            # The task's shared resources (a simulated user's engine) before its first episode.
            self.env.start(start_frozen_engine)
            if self.agent_endpoint is not None:
                self.agent_endpoint.start()
            for lane in range(self.rollout.scale_out.num_engines):
                self._launch(lane)
        except BaseException:
            self.close()
            raise

    def _launch(self, lane: int) -> None:
        """Lane `lane`: a (launched) engine serving the latest weights and version, and a producer on it."""
        engine = self.lanes.engine_up(lane, self._version)
        sampling = SamplingSettings(temperature=self.rollout.batch.temperature, top_k=self.rollout.batch.top_k)
        if self._use_dedicated and self.dedicated is None:
            self.dedicated = DedicatedWorker(
                self.model_path,
                sampling=sampling,
                pad_id=self.pad_id,
                lora=self.rollout.engine.lora,
                worker_factory=self.dedicated_worker_factory,
            )
            self.dedicated.start(engine.loop)
            self.dedicated.send_weights(self._weights, self._version)
        engine.push_weights(self._weights, self._version)
        self.buffer.set_trainer_version(self._version)
        settings = ProducerSettings(
            group_size=self.rollout.batch.group_size,
            max_concurrent_groups=lane_share(
                self.rollout.batch.max_concurrent_groups, lane, self.rollout.scale_out.num_engines, minimum=1
            ),
            sampling=sampling,
            max_context=self.engine_settings.max_model_len,
            # Each lane, each restart and a resumed run (at its version) draw other instances than the first engine's.
            seed=self.seed + 1_000_003 * self.engine_restarts + 7_919 * lane + 104_729 * self._version,
            groups_per_version=lane_share(self.groups_per_batch, lane, self.rollout.scale_out.num_engines)
            if self.rollout.batch.mode == "sync"
            else None,
            env_failure_limit=self.rollout.failures.env_failure_limit,
            env_failure_window=self.rollout.failures.env_failure_window,
            group_ids=self._group_ids,
            admits=lambda: not self._reading_checkpoint.is_set() and self.lanes.router.admits(lane),
            advantages=ADVANTAGES[self.rollout.batch.advantage](),
            draws=self.training_draws,
        )
        producer = RolloutProducer(
            engine,
            self.env,
            self.episode_formats,
            self.buffer,
            settings,
            dedicated=self.dedicated,
            agent_endpoint=self.agent_endpoint,
        )
        if lane == 0:
            producer.resumed_groups = self._resumed
            self._resumed = []
        self.lanes.producer_up(lane, producer, self._train)

    def _may_restart(self) -> bool:
        # Not with the dedicated worker: it is tied to the dead engine's loop.
        return self.engine_restarts < self.rollout.failures.engine_restarts and self.dedicated is None

    def _restart_engine(self, lane: int, reason: str) -> None:
        """Replace a dead engine with a new one serving the latest published weights and version.

        The episodes it was generating are lost: counted as produced and dropped ("lost"), so the
        accounting holds, and generated again by the new engine's producer.
        """
        lost, in_flight_groups = self.lanes.take_down(lane)
        # Its groups' reservations go back (a stopped producer's cancelled groups gave theirs back
        # themselves; a dead loop's never ran to do so); the other engines' groups keep theirs.
        self.buffer.release(in_flight_groups * self.rollout.batch.group_size)
        self.buffer.drop_produced(lost, "lost")
        self.engine_restarts += 1
        warnings.warn(
            f"{self.lanes.name(lane)} died ({reason}); restarting it with the weights of version {self._version} "
            f"(restart {self.engine_restarts} of "
            f"{config_key('rollout.engine_restarts')}={self.rollout.failures.engine_restarts}; "
            f"{lost} episodes in flight lost)",
            stacklevel=2,
        )
        self._launch(lane)

    def close(self) -> None:
        dedicated = self.dedicated
        self.dedicated = None
        try:
            # The dedicated worker after the producers (no more hand-offs), before the engines.
            self.lanes.close(between=dedicated.stop if dedicated is not None else lambda: None)
        finally:
            # After the producers: no episode asks the task's user or calls the endpoint any more.
            try:
                if self.agent_endpoint is not None:
                    self.agent_endpoint.stop()
            finally:
                self.env.close()

    # -- batches ----------------------------------------------------------------------------
    def next_batch(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            self._restart_or_raise_if_dead()
            try:
                groups = self.buffer.take(
                    self.groups_per_batch, timeout_s=min(self.liveness_poll_s, max(deadline - time.monotonic(), 0.0))
                )
                break
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"no batch of {self.groups_per_batch} groups within {timeout_s} s "
                        f"(raise {config_key('rollout.batch_timeout_s')} if generation is this slow); "
                        f"rollout stats: {self.stats()}"
                    ) from None
        trajectories = [t for group in groups for t in group]
        return training_batch(
            trajectories, self.pad_id, self.task_names, self.rollout.batch.temperature, self.rollout.batch.top_k
        )

    def _restart_or_raise_if_dead(self) -> None:
        """A dead engine is replaced while `rollout.engine_restarts` allows; any other failure is raised."""
        for lane, reason in self.lanes.dead_engines():
            if self._may_restart():
                self._restart_engine(lane, reason)
        self._raise_if_dead()

    def _raise_if_dead(self) -> None:
        """Name the part that died, within one liveness poll of its death."""
        if not self.started:
            raise RolloutServiceError("the rollout service is not started (or already closed)")
        # The engines first: when one dies, its producer's error is only its echo.
        for lane, reason in self.lanes.dead_engines():
            raise RolloutServiceError(f"{self.lanes.name(lane)} died: {reason}")
        for producer in self.lanes.producers:
            if producer is not None and producer.error is not None:
                raise RolloutServiceError(f"rollout generation failed: {producer.error!r}") from producer.error
        reason = self.dedicated.dead_reason() if self.dedicated is not None else None
        if reason is not None:
            raise RolloutServiceError(reason)

    # -- held-out evaluation ------------------------------------------------------------------
    def evaluate(self, instances: Sequence[Any], samples: int, timeout_s: float) -> dict[str, torch.Tensor]:
        engines = self._engines()
        self._raise_if_dead()
        return self.evaluator.evaluate(engines, instances, samples, timeout_s)

    # -- weights ----------------------------------------------------------------------------
    def publish_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> WeightPush | None:
        self.buffer.set_trainer_version(version)
        if version % self.weight_sync_every != 0:
            return None
        engines = self._engines()
        if self.dedicated is not None:
            # While paused, hand the worker every token of the outgoing version still unscored
            # (partial turns included); the worker scores them before it loads `version`.
            engine = engines[0]
            engine.pause()

            async def submit_outgoing() -> None:
                self.dedicated.submit(self._unfinished_trajectories(0))

            engine.run(submit_outgoing())
            self.dedicated.send_weights(weights, version)
        self._weights = weights
        self._version = version
        pushes = []
        for lane, engine in enumerate(engines):
            try:
                pushes.append(engine.push_weights(weights, version))
            except EngineDeadError as error:
                if not self._may_restart():
                    raise RolloutServiceError(f"{self.lanes.name(lane)}: {error}") from error
                self._restart_engine(lane, str(error))  # the new engine starts with these weights
        return pushed_one_after_another(pushes)

    def live_versions(self) -> list[int]:
        return self.lanes.live_versions(self.buffer.trainer_version, self.buffer.oldest_pending_version())

    # -- interruption-sync -----------------------------------------------------------------
    def pause(self) -> None:
        for engine in self._engines():
            engine.pause()

    def resume(self) -> None:
        for engine in self.lanes.live_engines():
            if engine.dead_reason() is None:
                engine.resume()

    def score_unscored(self, score_fn: ScoreFn, version: int) -> int:
        """Collection and attachment run on each engine's loop, which owns its trajectories (the
        pending ones go with the first engine); the forward runs on the caller's thread, with the
        caller's weights."""
        return sum(
            score_unscored_on(
                engine,
                lambda lane=lane: self._unfinished_trajectories(lane),
                score_fn,
                version,
                self.rollout.batch.temperature,
                self.rollout.batch.top_k,
                self.pad_id,
            )
            for lane, engine in enumerate(self._engines())
        )

    def _unfinished_trajectories(self, lane: int) -> list[Trajectory]:
        """Lane `lane`'s episodes being generated; lane 0 also takes the buffer's pending ones."""
        producer = self.lanes.producers[lane]
        active = (
            [segment for trajectory in list(producer.active) for segment in trajectory.segments] if producer else []
        )
        return (self.buffer.pending_trajectories() if lane == 0 else []) + active

    def _engines(self) -> list[Engine]:
        if not self.started:
            raise RolloutServiceError("the rollout service is not started (or already closed)")
        return self.lanes.live_engines()

    # -- statistics -------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        stats = rollout_stats(
            self.buffer, self.lanes.producers, self.lanes.engines, self.engine_restarts, self.dedicated
        )
        return stats | self.training_draws.stats()
