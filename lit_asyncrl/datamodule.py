"""The LightningDataModule: a thin adapter that streams a rollout service's [B, T] batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import lightning as L
from torch.utils.data import DataLoader, IterableDataset

from lit_asyncrl.envs import Environment, RangeGuessEnv
from lit_asyncrl.kill_points import kill_if_asked
from lit_asyncrl.lifecycle import Terminated, end_other_ranks
from lit_asyncrl.models import resolve_model_path
from lit_asyncrl.rollout.service import RolloutService, ServiceFactory
from lit_asyncrl.rollout.serving.instances import held_out_instances
from lit_asyncrl.rollout.settings import RolloutConfig
from lit_asyncrl.rollout.vllm_service_factory import VLLMServiceFactory


class RolloutDataModule(L.LightningDataModule):
    """A thin Lightning adapter around a `RolloutService`: its batches as a training stream.

    The service does the work (engines, producers, buffer, dedicated old-logit worker); this class
    has it built by `service` from the settings, closes it on every way out of a fit (teardown,
    exception, Ctrl-C) and hands it to the callbacks that need it as `rollouts`. The batch schema is
    documented in `lit_asyncrl.rollout.service`.

    Args:
        model_path: the model the engine serves: a local Hugging Face folder, a hub id (fetched when
            online), "smollm2_135m" (a real chat model, offline) or None (the built-in tiny policy).
        env: the task (None = the range-guessing game, `RangeGuessEnv`).
        rollout: every rollout setting (`RolloutConfig`; `rollout.*` in Hydra, `data.rollout.*` in
            the Lightning CLI), checked when it is made.
        seed: task instances (training and held-out) are drawn from this seed.
        service: what builds the rollout service (None = `VLLMServiceFactory`, vLLM engines); a
            second implementation is a `ServiceFactory` subclass named here.
    """

    def __init__(
        self,
        model_path: str | None = None,
        env: Environment | None = None,
        rollout: RolloutConfig | None = None,
        seed: int = 0,
        service: ServiceFactory | None = None,
    ) -> None:
        super().__init__()
        self.rollout_config = rollout if rollout is not None else RolloutConfig()
        # Resolve (and for the tiny policy, build) the model folder now: a bad path fails here,
        # before any engine starts.
        self.model_path = resolve_model_path(model_path)
        self.env = env if env is not None else RangeGuessEnv()
        self.eval_instances = held_out_instances(self.env, self.rollout_config.evaluation.eval_instances, seed=seed)
        factory = service if service is not None else VLLMServiceFactory()
        self.rollouts: RolloutService = factory.build(self.model_path, self.env, self.rollout_config, seed)

    def setup(self, stage: str) -> None:
        # Before the callbacks' setup, which looks the service up here.
        if self.trainer is not None:
            self.configure_service(self.trainer)

    def configure_service(self, trainer: L.Trainer) -> None:
        """The service as this training process uses it: under DDP every rank reaches rank 0's.
        The weight route depends on the number of processes, so rank 0 calls this before its engines
        launch (`before_fit.launch_and_warm_start`); calling it again changes nothing."""
        self.rollouts = self.rollouts.configure(trainer.world_size, trainer.global_rank)

    def state_dict(self) -> dict:
        # Saved in every checkpoint: produced = trained + dropped + pending holds across a resume.
        return {"rollout_service": self.rollouts.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        if "rollout_service" in state_dict:
            self.rollouts.load_state_dict(state_dict["rollout_service"])
        elif "rollout_accounting" in state_dict:  # checkpoints written before 2026-12-03
            self.rollouts.load_state_dict({"accounting": state_dict["rollout_accounting"]})

    def train_dataloader(self) -> DataLoader:
        # batch_size=None: the dataset yields whole collated batches; workers must stay in-process.
        stream = _ServiceStream(
            self.rollouts,
            self.rollout_config.batch.batch_timeout_s,
            step=lambda: self.trainer.global_step if self.trainer else 0,
        )
        return DataLoader(stream, batch_size=None, num_workers=0)

    def val_dataloader(self) -> DataLoader:
        # Held-out instances in chunks (a progress-bar tick each), played at validation time.
        settings = self.rollout_config
        evaluation = _HeldOutEvaluation(
            self.rollouts,
            self.eval_instances,
            settings.evaluation.eval_samples,
            settings.evaluation.eval_k,
            settings.evaluation.eval_timeout_s,
        )
        return DataLoader(evaluation, batch_size=None, num_workers=0)

    def teardown(self, stage: str) -> None:
        self.rollouts.close()

    def on_exception(self, exception: BaseException) -> None:
        # Lightning skips `teardown` when fit raises (or is interrupted): close here too.
        self.rollouts.close()
        if isinstance(exception, Terminated):
            end_other_ranks(self.trainer)


class _ServiceStream(IterableDataset):
    def __init__(self, rollouts: RolloutService, timeout_s: float, step: Callable[[], int]) -> None:
        self.rollouts = rollouts
        self.timeout_s = timeout_s
        self.step = step

    def __iter__(self) -> Iterator[dict]:
        while True:
            kill_if_asked("batch_wait", self.step())
            yield self.rollouts.next_batch(self.timeout_s)


class _HeldOutEvaluation(IterableDataset):
    """Yields, per chunk of held-out instances, what the service's `evaluate` played, plus `k`."""

    chunk_size = 8

    def __init__(self, rollouts: RolloutService, instances: list, samples: int, k: int, timeout_s: float) -> None:
        self.rollouts = rollouts
        self.instances = instances
        self.samples = samples
        self.k = k
        self.timeout_s = timeout_s

    def __len__(self) -> int:
        return -(-len(self.instances) // self.chunk_size)

    def __iter__(self) -> Iterator[dict]:
        for start in range(0, len(self.instances), self.chunk_size):
            chunk = self.instances[start : start + self.chunk_size]
            yield {**self.rollouts.evaluate(chunk, self.samples, self.timeout_s), "k": self.k}
