"""Environments: the protocol and the built-in tasks.

The names below are imported when first asked for (`lit_asyncrl.envs.DatasetEnv`), not with the
package: a module of one task (`lit_asyncrl.envs.dataset_task.math_answers`, which a spawned worker
imports, or `lit_asyncrl.envs.base`) then loads without every other task and its third-party suite.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lit_asyncrl.envs.adapters.gem import GemEnv
    from lit_asyncrl.envs.adapters.reasoning_gym import ReasoningGymEnv
    from lit_asyncrl.envs.agent_program import AgentProgramEnv, ExternalAgentEnv
    from lit_asyncrl.envs.base import Environment, TextEnv, Transition
    from lit_asyncrl.envs.dataset_task.task import DatasetEnv
    from lit_asyncrl.envs.guess_number import GuessNumberEnv
    from lit_asyncrl.envs.mixture import BalancedTaskMix, MixInstance, TaskMix
    from lit_asyncrl.envs.range_guess import RangeGuessEnv
    from lit_asyncrl.envs.service_desk.task import ServiceDeskEnv
    from lit_asyncrl.envs.service_desk.tools_task import ServiceDeskToolsEnv
    from lit_asyncrl.envs.tools import Ending, Grade, Tool, ToolEnv
    from lit_asyncrl.envs.users.llm_user import LLMUser
    from lit_asyncrl.envs.users.simulated import CooperativeUser, ScriptedUser, SimulatedUser

#: Each public name and the module that defines it.
_PUBLIC = {
    "GemEnv": "lit_asyncrl.envs.adapters.gem",
    "AgentProgramEnv": "lit_asyncrl.envs.agent_program",
    "ExternalAgentEnv": "lit_asyncrl.envs.agent_program",
    "ReasoningGymEnv": "lit_asyncrl.envs.adapters.reasoning_gym",
    "Environment": "lit_asyncrl.envs.base",
    "TextEnv": "lit_asyncrl.envs.base",
    "Transition": "lit_asyncrl.envs.base",
    "DatasetEnv": "lit_asyncrl.envs.dataset_task.task",
    "GuessNumberEnv": "lit_asyncrl.envs.guess_number",
    "BalancedTaskMix": "lit_asyncrl.envs.mixture",
    "MixInstance": "lit_asyncrl.envs.mixture",
    "TaskMix": "lit_asyncrl.envs.mixture",
    "RangeGuessEnv": "lit_asyncrl.envs.range_guess",
    "ServiceDeskEnv": "lit_asyncrl.envs.service_desk.task",
    "ServiceDeskToolsEnv": "lit_asyncrl.envs.service_desk.tools_task",
    "Ending": "lit_asyncrl.envs.tools",
    "Grade": "lit_asyncrl.envs.tools",
    "Tool": "lit_asyncrl.envs.tools",
    "ToolEnv": "lit_asyncrl.envs.tools",
    "LLMUser": "lit_asyncrl.envs.users.llm_user",
    "CooperativeUser": "lit_asyncrl.envs.users.simulated",
    "ScriptedUser": "lit_asyncrl.envs.users.simulated",
    "SimulatedUser": "lit_asyncrl.envs.users.simulated",
}

__all__ = [
    "AgentProgramEnv",
    "BalancedTaskMix",
    "CooperativeUser",
    "DatasetEnv",
    "Ending",
    "Environment",
    "ExternalAgentEnv",
    "GemEnv",
    "Grade",
    "GuessNumberEnv",
    "LLMUser",
    "MixInstance",
    "RangeGuessEnv",
    "ReasoningGymEnv",
    "ScriptedUser",
    "ServiceDeskEnv",
    "ServiceDeskToolsEnv",
    "SimulatedUser",
    "TaskMix",
    "TextEnv",
    "Tool",
    "ToolEnv",
    "Transition",
]


def __getattr__(name: str) -> object:
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
