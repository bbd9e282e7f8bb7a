"""Environments: the protocol and the built-in tasks."""

from lit_asyncrl.envs.base import Environment, TextEnv, Transition
from lit_asyncrl.envs.gem_adapter import GemEnv
from lit_asyncrl.envs.guess_number import GuessNumberEnv
from lit_asyncrl.envs.reasoning_gym_adapter import ReasoningGymEnv
from lit_asyncrl.envs.service_desk import ServiceDeskEnv

__all__ = ["Environment", "GemEnv", "GuessNumberEnv", "ReasoningGymEnv", "ServiceDeskEnv", "TextEnv", "Transition"]
