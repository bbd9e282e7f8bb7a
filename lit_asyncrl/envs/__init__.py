"""Environments: the protocol and the built-in tasks."""

from lit_asyncrl.envs.base import Environment, TextEnv, Transition
from lit_asyncrl.envs.gem_adapter import GemEnv
from lit_asyncrl.envs.guess_number import GuessNumberEnv
from lit_asyncrl.envs.llm_user import LLMUser
from lit_asyncrl.envs.mixture import BalancedTaskMix, MixInstance, TaskMix
from lit_asyncrl.envs.reasoning_gym_adapter import ReasoningGymEnv
from lit_asyncrl.envs.service_desk import ServiceDeskEnv
from lit_asyncrl.envs.users import CooperativeUser, SimulatedUser

__all__ = [
    "BalancedTaskMix",
    "CooperativeUser",
    "Environment",
    "GemEnv",
    "GuessNumberEnv",
    "LLMUser",
    "MixInstance",
    "ReasoningGymEnv",
    "ServiceDeskEnv",
    "SimulatedUser",
    "TaskMix",
    "TextEnv",
    "Transition",
]
