"""`RolloutService` on one in-process vLLM engine: engine, producer, buffer, dedicated worker."""

from __future__ import annotations

import asyncio
import random
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from lit_asyncrl.envs.base import Environment
from lit_asyncrl.rollout.buffer import RolloutBuffer
from lit_asyncrl.rollout.dedicated import DedicatedOldLogitModel
from lit_asyncrl.rollout.engine import EngineConfig, EngineDeadError, VLLMEngine
from lit_asyncrl.rollout.env_calls import EnvCaller, call_blocking
from lit_asyncrl.rollout.episode import play_episode
from lit_asyncrl.rollout.episode_format import EpisodeFormat, episode_format_for
from lit_asyncrl.rollout.old_logits import attach, collect_unscored, score_requests
from lit_asyncrl.rollout.producer import RolloutProducer
from lit_asyncrl.rollout.records import Trajectory, collate
from lit_asyncrl.rollout.service import RolloutServiceError, ScoreFn
from lit_asyncrl.text import pad_token_id


class VLLMRolloutService:
    """Generation on a background vLLM `AsyncLLM` in this process (see `RolloutService`).

    Nothing expensive happens before `start`: the constructor only checks its arguments and loads
    the tokenizer. `close` stops the producer, the dedicated worker and the engine (its process,
    thread and temp dir) in that order, whatever state they are in.

    Args:
        model_path: a local Hugging Face model folder the engine serves.
        env: the task; episodes of one instance form a group of `group_size` (GRPO advantages).
        groups_per_batch: groups per training batch (B = groups_per_batch * group_size episodes).
        max_version_gap: groups with a token more than this many versions behind are dropped.
        buffer_capacity: most episodes pending or being generated; the engine waits beyond it.
        max_concurrent_groups: groups generated at once.
        mode: "async" (generation never waits for training) or "sync" (one batch per version).
        weight_sync_every: push weights to the engine every this many versions.
        temperature, top_k: sampling; the trainer scores with the same values (they ride in the batch).
        engine_config: the vLLM engine's settings.
        seed: task instances are drawn from this seed.
        liveness_poll_s: how often a waiting `next_batch` checks that every part is alive.
        env_failure_limit, env_failure_window: the run stops when more than this share of the last
            `env_failure_window` episodes failed in the environment (raised, malformed answer, timeout).
        engine_restarts: how many times a dead (or stalled) engine is replaced by a new one serving
            the latest published weights and version before the run stops; 0 = stop at once.
    """

    def __init__(
        self,
        model_path: str | Path,
        env: Environment,
        *,
        group_size: int,
        groups_per_batch: int,
        max_version_gap: int,
        buffer_capacity: int,
        max_concurrent_groups: int,
        mode: Literal["async", "sync"],
        weight_sync_every: int,
        temperature: float,
        top_k: int,
        engine_config: EngineConfig,
        seed: int,
        liveness_poll_s: float = 0.5,
        env_failure_limit: float = 0.5,
        env_failure_window: int = 64,
        engine_restarts: int = 0,
    ) -> None:
        from transformers import AutoTokenizer

        self.model_path, self.env = str(model_path), env
        self.group_size, self.groups_per_batch = group_size, groups_per_batch
        self.max_version_gap, self.weight_sync_every = max_version_gap, weight_sync_every
        self.max_concurrent_groups, self.mode = max_concurrent_groups, mode
        self.temperature, self.top_k = temperature, top_k
        self.engine_config, self.seed = engine_config, seed
        self.liveness_poll_s = liveness_poll_s
        self.env_failure_limit, self.env_failure_window = env_failure_limit, env_failure_window
        self.max_engine_restarts, self.engine_restarts = engine_restarts, 0
        self._weights: Mapping[str, torch.Tensor] = {}
        self._version, self._train = 0, True
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        # Made here, before any engine starts: an unusable chat template or stop text fails fast.
        self.episode_format = episode_format_for(self.tokenizer, env)
        self.pad_id = pad_token_id(self.tokenizer)
        _check_tokenizer_fits_model(self.model_path, self.tokenizer)
        _check_context_holds_a_turn(env, self.episode_format, engine_config.max_model_len, seed)
        self.buffer = RolloutBuffer(buffer_capacity, max_version_gap)
        self.engine: VLLMEngine | None = None
        #: An engine launched by `launch_early`, taken over by `start`.
        self._early_engine: VLLMEngine | None = None
        self.producer: RolloutProducer | None = None
        self.dedicated: DedicatedOldLogitModel | None = None
        self._use_dedicated = False

    # -- lifecycle --------------------------------------------------------------------------
    def use_old_logit_worker(self) -> None:
        if self.engine is not None:
            raise RuntimeError("use_old_logit_worker() must be called before start()")
        self._use_dedicated = True

    def launch_early(self) -> None:
        """Begin the engine's start now, in the background; `start` waits for it and loads its weights.

        The engine's initial weights (the model folder's) never sample: `start` replaces them
        with the trainer's before the first request, so launching before the warm start is safe.
        """
        if self.engine is None and self._early_engine is None:
            self._early_engine = VLLMEngine(self.model_path, self.engine_config)
            self._early_engine.launch()

    def start(self, weights: Mapping[str, torch.Tensor], version: int, train: bool = True) -> None:
        if self.engine is not None:
            raise RuntimeError("the rollout service is already started")
        try:
            self._launch(weights, version, train)
        except BaseException:
            self.close()
            raise

    def _launch(self, weights: Mapping[str, torch.Tensor], version: int, train: bool) -> None:
        """A new engine serving `weights` as `version`, and a producer on it."""
        self._weights, self._version, self._train = weights, version, train
        engine, self._early_engine = self._early_engine, None
        if engine is None:  # not launched early (or a restart)
            engine = VLLMEngine(self.model_path, self.engine_config)
            engine.launch(initial_version=version)
        self.engine = engine
        self.engine.wait_until_serving()
        if self._use_dedicated and self.dedicated is None:
            self.dedicated = DedicatedOldLogitModel(self.model_path, temperature=self.temperature, top_k=self.top_k, pad_id=self.pad_id)
            self.dedicated.start(self.engine.loop)
            self.dedicated.send_weights(weights, version)
        self.engine.push_weights(weights, version)
        self.buffer.set_trainer_version(version)
        previous = self.producer
        self.producer = RolloutProducer(
            self.engine,
            self.env,
            self.episode_format,
            self.buffer,
            group_size=self.group_size,
            max_concurrent_groups=self.max_concurrent_groups,
            temperature=self.temperature,
            top_k=self.top_k,
            max_context=self.engine_config.max_model_len,
            # After a restart: other instances than the first engine's, group ids that go on.
            seed=self.seed + 1_000_003 * self.engine_restarts,
            groups_per_version=self.groups_per_batch if self.mode == "sync" else None,
            old_logit_model=self.dedicated,
            env_failure_limit=self.env_failure_limit,
            env_failure_window=self.env_failure_window,
        )
        if previous is not None:
            self.producer.next_group_id = previous.next_group_id
            self.producer.carry_counts_from(previous)
        if train:
            self.producer.start()

    def _may_restart(self) -> bool:
        # Not with the dedicated worker: it is tied to the dead engine's loop.
        return self.engine_restarts < self.max_engine_restarts and self.dedicated is None

    def _restart_engine(self, reason: str) -> None:
        """Replace a dead engine with a new one serving the latest published weights and version.

        The episodes it was generating are lost: counted as produced and dropped ("lost"), so the
        accounting holds, and generated again by the new engine's producer.
        """
        engine, producer = self.engine, self.producer
        lost = len(producer.active) if producer is not None else 0
        try:
            if producer is not None and engine is not None and engine.loop.is_running():
                producer.stop()  # cancels the dead engine's groups on its loop
            elif producer is not None:
                producer.call_env.close()
        except Exception:  # a loop that no longer answers: the engine is shut down below anyway
            producer.call_env.close()
        finally:
            if engine is not None:
                engine.shutdown()
        self.buffer.drop_reservations()
        self.buffer.drop_produced(lost, "lost")
        self.engine_restarts += 1
        warnings.warn(
            f"the vLLM engine died ({reason}); restarting it with the weights of version {self._version} "
            f"(restart {self.engine_restarts} of data.engine_restarts={self.max_engine_restarts}; {lost} episodes in flight lost)",
            stacklevel=2,
        )
        self.engine = None
        self._launch(self._weights, self._version, self._train)

    def close(self) -> None:
        producer, dedicated, engine = self.producer, self.dedicated, self.engine or self._early_engine
        self.producer = self.dedicated = self.engine = self._early_engine = None
        try:
            if producer is not None and engine is not None and engine.dead_reason() is None:
                producer.stop()
            elif producer is not None:
                producer.call_env.close()
        finally:
            try:
                if dedicated is not None:
                    dedicated.stop()
            finally:
                if engine is not None:
                    engine.shutdown()

    # -- batches ----------------------------------------------------------------------------
    def next_batch(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            self._restart_or_raise_if_dead()
            try:
                groups = self.buffer.take(self.groups_per_batch, timeout_s=min(self.liveness_poll_s, max(deadline - time.monotonic(), 0.0)))
                break
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"no batch of {self.groups_per_batch} groups within {timeout_s} s (raise data.batch_timeout_s "
                        f"if generation is this slow); rollout stats: {self.stats()}"
                    ) from None
        batch = collate([t for group in groups for t in group], pad_id=self.pad_id)
        batch["temperature"] = self.temperature
        batch["top_k"] = self.top_k
        return batch

    def _restart_or_raise_if_dead(self) -> None:
        """A dead engine is replaced while `data.engine_restarts` allows; any other failure is raised."""
        reason = self.engine.dead_reason() if self.engine is not None else None
        if reason is not None and self._may_restart():
            self._restart_engine(reason)
        self._raise_if_dead()

    def _raise_if_dead(self) -> None:
        """Name the part that died, within one liveness poll of its death."""
        if self.engine is None:
            raise RolloutServiceError("the rollout service is not started (or already closed)")
        # The engine first: when it dies, the producer's error is only its echo.
        reason = self.engine.dead_reason()
        if reason is not None:
            raise RolloutServiceError(f"the vLLM engine died: {reason}")
        if self.producer is not None and self.producer.error is not None:
            raise RolloutServiceError(f"rollout generation failed: {self.producer.error!r}") from self.producer.error
        reason = self.dedicated.dead_reason() if self.dedicated is not None else None
        if reason is not None:
            raise RolloutServiceError(reason)

    # -- held-out evaluation ------------------------------------------------------------------
    def evaluate(self, instances: Sequence[Any], samples: int, timeout_s: float) -> dict[str, torch.Tensor]:
        engine = self._engine()
        self._raise_if_dead()
        # Its own thread pool: evaluation's synchronous tools never queue behind training episodes.
        call_env = EnvCaller(max_workers=max(1, min(64, len(instances) * (samples + 1))))
        sampled = {"temperature": self.temperature, "top_k": self.top_k}
        greedy = {"temperature": 1.0, "top_k": 1}  # top-1 sampling is greedy decoding

        async def play(instance: Any, seed: int, sampling: dict) -> Trajectory:
            trajectory = Trajectory(group_id=-1)
            max_context = self.engine_config.max_model_len
            return await play_episode(
                engine,
                self.env,
                self.episode_format,
                instance,
                trajectory,
                call_env=call_env,
                seed=seed,
                max_context=max_context,
                **sampling,
            )

        async def play_all() -> list[Trajectory]:
            plays = []
            for index, instance in enumerate(instances):
                plays += [play(instance, index * (samples + 1) + j, sampled) for j in range(samples)]
                plays.append(play(instance, index * (samples + 1) + samples, greedy))
            return await asyncio.gather(*plays)

        try:
            played = engine.run(play_all(), timeout_s=timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"held-out evaluation of {len(instances)} instances x {samples + 1} episodes took over {timeout_s} s (raise data.eval_timeout_s)"
            ) from None
        except EngineDeadError as error:
            raise RolloutServiceError(str(error)) from error
        finally:
            call_env.close()
        rows = [played[index * (samples + 1) : (index + 1) * (samples + 1)] for index in range(len(instances))]
        return {
            "success": torch.tensor([[float(t.success) for t in row[:samples]] for row in rows]),
            "rewards": torch.tensor([[t.reward for t in row[:samples]] for row in rows]),
            "greedy_success": torch.tensor([float(row[samples].success) for row in rows]),
        }

    # -- weights ----------------------------------------------------------------------------
    def publish_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> dict[str, float]:
        self.buffer.set_trainer_version(version)
        if version % self.weight_sync_every != 0:
            return {}
        engine = self._engine()
        if self.dedicated is not None:
            # While paused, hand the worker every token of the outgoing version still unscored
            # (partial turns included); the worker scores them before it loads `version`.
            engine.pause()

            async def submit_outgoing() -> None:
                self.dedicated.submit(self._unfinished_trajectories())

            engine.run(submit_outgoing())
            self.dedicated.send_weights(weights, version)
        self._weights, self._version = weights, version
        try:
            return engine.push_weights(weights, version)
        except EngineDeadError as error:
            if self._may_restart():
                self._restart_engine(str(error))  # the new engine starts with these weights
                return {}
            raise RolloutServiceError(str(error)) from error

    def live_versions(self) -> list[int]:
        engine_version = self.engine.version if self.engine is not None else 0
        newest = max(self.buffer.trainer_version, engine_version)
        in_flight = self.producer.oldest_in_flight_version if self.producer is not None else None
        candidates = [v for v in (self.buffer.oldest_pending_version(), in_flight) if v is not None]
        return list(range(min(candidates, default=newest), newest + 1))

    # -- interruption-sync -----------------------------------------------------------------
    def pause(self) -> None:
        self._engine().pause()

    def resume(self) -> None:
        if self.engine is not None and self.engine.dead_reason() is None:
            self.engine.resume()

    def score_unscored(self, score_fn: ScoreFn, version: int) -> int:
        """Collection and attachment run on the engine loop, which owns the trajectories; the
        forward runs on the caller's thread, with the caller's weights."""
        engine = self._engine()

        async def collect():
            return collect_unscored(self._unfinished_trajectories())

        requests = engine.run(collect())
        scores = score_requests(score_fn, requests, temperature=self.temperature, top_k=self.top_k, pad_id=self.pad_id)

        async def write_back():
            return attach(requests, scores, version)

        return engine.run(write_back())

    def _unfinished_trajectories(self) -> list[Trajectory]:
        active = list(self.producer.active) if self.producer is not None else []
        return self.buffer.pending_trajectories() + active

    def _engine(self) -> VLLMEngine:
        if self.engine is None:
            raise RolloutServiceError("the rollout service is not started (or already closed)")
        return self.engine

    # -- statistics -------------------------------------------------------------------------
    def stats(self) -> dict[str, float]:
        producer = self.producer
        stats = {f"rollout/{key}": float(value) for key, value in self.buffer.counts().items()}
        stats["rollout/queue_depth"] = stats["rollout/pending"]
        stats["rollout/in_flight_groups"] = float(producer.in_flight_groups if producer else 0)
        stats["rollout/tokens_per_s"] = float(producer.tokens_per_s if producer else 0.0)
        stats["rollout/engine_version"] = float(self.engine.version if self.engine else -1)
        stats["rollout/timed_out_episodes"] = float(producer.timed_out_episodes if producer else 0)
        if producer is not None:
            stats["rollout/env_failures"] = float(sum(producer.env_failures.values()))
            stats["rollout/env_failure_rate"] = sum(producer.recent_failures) / max(len(producer.recent_failures), 1)
        stats["rollout/engine_restarts"] = float(self.engine_restarts)
        if self.dedicated is not None:
            stats["dedicated/queue_depth"] = float(self.dedicated.queue_depth)
            stats["dedicated/scored_tokens"] = float(self.dedicated.scored_tokens)
            stats["dedicated/score_s"] = self.dedicated.score_seconds
            stats["dedicated/group_wait_s"] = producer.scoring_wait_s if producer else 0.0
        return stats


def _check_tokenizer_fits_model(model_path: str, tokenizer: Any) -> None:
    """A tokenizer with ids past the model's embedding table is another model's tokenizer."""
    from transformers import AutoConfig

    vocab_size = getattr(AutoConfig.from_pretrained(model_path), "vocab_size", None)
    if vocab_size is not None and len(tokenizer) > vocab_size:
        raise ValueError(
            f"model.path={model_path}: its tokenizer has {len(tokenizer)} tokens but the model's vocabulary only "
            f"{vocab_size}; the folder mixes two models' files"
        )


def _check_context_holds_a_turn(env: Environment, episode_format: EpisodeFormat, max_model_len: int, seed: int) -> None:
    """Refuse a context too short for the first prompt and one token of answer (it would spin, not train)."""
    opening = Trajectory(group_id=-1)
    instance = env.sample_instance(random.Random(seed))
    episode_format.open(opening, call_blocking(env.new_episode(instance).reset, seed))
    if len(opening.token_ids) >= max_model_len:
        raise ValueError(
            f"data.max_model_len={max_model_len} leaves no room for the agent: the first prompt of {type(env).__name__} "
            f"is already {len(opening.token_ids)} tokens"
        )
