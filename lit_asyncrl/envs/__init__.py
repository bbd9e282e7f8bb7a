"""Environments: the protocol and the built-in tasks."""

from lit_asyncrl.envs.adapters.gem import GemEnv
from lit_asyncrl.envs.adapters.reasoning_gym import ReasoningGymEnv
from lit_asyncrl.envs.base import Environment, TextEnv, Transition
from lit_asyncrl.envs.dataset_task.task import DatasetEnv
from lit_asyncrl.envs.guess_number import GuessNumberEnv
from lit_asyncrl.envs.mixture import BalancedTaskMix, MixInstance, TaskMix
from lit_asyncrl.envs.range_guess import RangeGuessEnv
from lit_asyncrl.envs.service_desk.task import ServiceDeskEnv
from lit_asyncrl.envs.service_desk.tools_task import ServiceDeskToolsEnv
from lit_asyncrl.envs.tools import Grade, Tool, ToolEnv
from lit_asyncrl.envs.users.llm_user import LLMUser
from lit_asyncrl.envs.users.simulated import CooperativeUser, SimulatedUser

__all__ = [
    "BalancedTaskMix",
    "CooperativeUser",
    "DatasetEnv",
    "Environment",
    "GemEnv",
    "Grade",
    "GuessNumberEnv",
    "LLMUser",
    "MixInstance",
    "RangeGuessEnv",
    "ReasoningGymEnv",
    "ServiceDeskEnv",
    "ServiceDeskToolsEnv",
    "SimulatedUser",
    "TaskMix",
    "TextEnv",
    "Tool",
    "ToolEnv",
    "Transition",
]
