"""Tool-calling tasks: tools as Python functions or JSON schemas, called by chat models' JSON function calls."""

from lit_asyncrl.envs.tools.calls import ERROR_REASONS, AssistantTurn, ToolCall, ToolMessage, ToolOpening
from lit_asyncrl.envs.tools.tool import Tool, as_tool
from lit_asyncrl.envs.tools.tool_env import Grade, ToolEnv, ToolEpisode

__all__ = [
    "ERROR_REASONS",
    "AssistantTurn",
    "Grade",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "ToolEpisode",
    "ToolMessage",
    "ToolOpening",
    "as_tool",
]
