"""The default `ServiceFactory`: the rollout service on vLLM engines (`VLLMRolloutService`)."""

from __future__ import annotations

from pathlib import Path

from lit_asyncrl.envs.base import Environment
from lit_asyncrl.rollout.service import RolloutService, ServiceFactory
from lit_asyncrl.rollout.serving.vllm_service import VLLMRolloutService
from lit_asyncrl.rollout.settings import RolloutConfig


class VLLMServiceFactory(ServiceFactory):
    """`VLLMRolloutService`: engines started by this process or as Ray actors (`rollout.placement`)."""

    def build(self, model_path: str | Path, env: Environment, rollout: RolloutConfig, seed: int) -> RolloutService:
        return VLLMRolloutService(model_path, env, rollout, seed=seed)
