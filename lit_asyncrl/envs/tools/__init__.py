"""Tool-calling tasks: tools as Python functions or JSON schemas, called by chat models' JSON function calls."""

from lit_asyncrl.envs.tools.calls import ERROR_REASONS, AssistantTurn, ToolCall, ToolMessage, ToolOpening
from lit_asyncrl.envs.tools.endings import CUT_OFFS, Ending
from lit_asyncrl.envs.tools.tool import Tool, as_tool
from lit_asyncrl.envs.tools.tool_env import Grade, ToolEnv, ToolEpisode
from lit_asyncrl.envs.tools.user_turns import UserMessage, UserOpening

__all__ = [
    "CUT_OFFS",
    "ERROR_REASONS",
    "AssistantTurn",
    "Ending",
    "Grade",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "ToolEpisode",
    "ToolMessage",
    "ToolOpening",
    "UserMessage",
    "UserOpening",
    "as_tool",
]
