"""Held-out evaluation: each instance played `samples` times by sampling and once greedily, on the
running engines (instances dealt over them, played at the same time)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from lit_asyncrl.config_keys import config_key
from lit_asyncrl.envs.base import Environment
from lit_asyncrl.rollout.engine.protocol import Engine, EngineDeadError
from lit_asyncrl.rollout.episodes.env_calls import EnvCaller
from lit_asyncrl.rollout.episodes.formats import EpisodeFormat
from lit_asyncrl.rollout.episodes.runner import EpisodeSettings, play_instance
from lit_asyncrl.rollout.episodes.sampling import GREEDY, SamplingSettings
from lit_asyncrl.rollout.records import Trajectory, task_columns
from lit_asyncrl.rollout.service import RolloutServiceError

if TYPE_CHECKING:
    from lit_asyncrl.rollout.agent_endpoint.server import AgentEndpoint


class HeldOutEvaluator:
    """Plays held-out instances with the training run's sampling settings (and greedily).

    Args:
        env: the task (a mixture plays each instance as its own task).
        episode_formats: each task's episode format, by task name.
        sampling: the sampled episodes' settings (the greedy one takes top-1, `GREEDY`).
        max_context: the engines' context in tokens.
        task_names: a mixture's task names (results say which task played each row); () otherwise.
        agent_endpoint: the run's endpoint, for an agent program's episodes (None for other tasks).
    """

    def __init__(
        self,
        env: Environment,
        episode_formats: Mapping[str | None, EpisodeFormat],
        sampling: SamplingSettings,
        max_context: int,
        task_names: Sequence[str],
        agent_endpoint: AgentEndpoint | None = None,
    ) -> None:
        self.env = env
        self.agent_endpoint = agent_endpoint
        self.episode_formats = episode_formats
        self.sampling = sampling
        self.max_context = max_context
        self.task_names = tuple(task_names)

    def evaluate(
        self, engines: Sequence[Engine], instances: Sequence[Any], samples: int, timeout_s: float
    ) -> dict[str, torch.Tensor]:
        """`success` and `rewards` [instances, samples], `greedy_success` [instances] (and task columns)."""
        # Instances dealt round-robin over the engines, which play their shares at the same time.
        shares = [list(range(lane, len(instances), len(engines))) for lane in range(len(engines))]
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(engines), thread_name_prefix="held-out") as pool:
            futures = [
                pool.submit(self._evaluate_on, engine, [instances[i] for i in share], share, samples, timeout_s)
                for engine, share in zip(engines, shares)
            ]
            rows: dict[int, list[Trajectory]] = {}
            for share, future in zip(shares, futures):
                rows.update(zip(share, future.result()))
        ordered = [rows[index] for index in range(len(instances))]
        played = {
            "success": torch.tensor([[float(t.success) for t in row[:samples]] for row in ordered]),
            "rewards": torch.tensor([[t.reward for t in row[:samples]] for row in ordered]),
            "greedy_success": torch.tensor([float(row[samples].success) for row in ordered]),
        }
        if self.task_names:
            played.update(task_columns([row[samples] for row in ordered], self.task_names))
        return played

    def _evaluate_on(
        self, engine: Engine, instances: list[Any], indices: list[int], samples: int, timeout_s: float
    ) -> list[list[Trajectory]]:
        """`samples` sampled and one greedy episode of each instance on `engine`; one row per instance.

        Episode seeds come from each instance's index in the whole held-out set, so the result does
        not depend on how many engines share the evaluation.
        """
        # Its own thread pool: evaluation's synchronous tools never queue behind training episodes.
        call_env = EnvCaller(max_workers=max(1, min(64, len(instances) * (samples + 1))))

        async def play(instance: Any, seed: int, sampling: SamplingSettings) -> Trajectory:
            trajectory = Trajectory(group_id=-1)
            settings = EpisodeSettings(
                call_env=call_env,
                sampling=sampling,
                max_context=self.max_context,
                seed=seed,
                agent_endpoint=self.agent_endpoint,
            )
            return await play_instance(engine, self.env, self.episode_formats, instance, trajectory, settings)

        async def play_all() -> list[Trajectory]:
            plays = []
            for index, instance in zip(indices, instances):
                plays += [play(instance, index * (samples + 1) + j, self.sampling) for j in range(samples)]
                plays.append(play(instance, index * (samples + 1) + samples, GREEDY))
            return await asyncio.gather(*plays)

        try:
            played = engine.run(play_all(), timeout_s=timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"held-out evaluation of {len(instances)} instances x {samples + 1} episodes took over {timeout_s} s "
                f"(raise {config_key('rollout.eval_timeout_s')})"
            ) from None
        except EngineDeadError as error:
            raise RolloutServiceError(str(error)) from error
        finally:
            call_env.close()
        return [played[row * (samples + 1) : (row + 1) * (samples + 1)] for row in range(len(instances))]
