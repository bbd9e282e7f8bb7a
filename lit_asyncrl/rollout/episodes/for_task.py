"""Which episode format plays a task: the chat template or raw text, with tool calls for tool tasks."""

from __future__ import annotations

from typing import Any

from lit_asyncrl.envs.agent_program import AgentTask
from lit_asyncrl.envs.base import Environment
from lit_asyncrl.envs.tools import ToolEnv
from lit_asyncrl.rollout.episodes.formats import ChatTemplateFormat, EpisodeFormat, PlainFormat
from lit_asyncrl.rollout.episodes.tool_calls import ChatToolFormat, CompactToolFormat


def episode_format_for(tokenizer: Any, env: Environment) -> EpisodeFormat:
    """The chat template when the tokenizer has one, raw text otherwise; for a `ToolEnv`, the same
    two with the model's tool calls parsed and the tools' answers rendered (an agent program's too: its
    calls may offer tools)."""
    chat = bool(getattr(tokenizer, "chat_template", None))
    if isinstance(env, (ToolEnv, AgentTask)):
        return ChatToolFormat(tokenizer, env) if chat else CompactToolFormat(tokenizer, env)
    return ChatTemplateFormat(tokenizer, env) if chat else PlainFormat(tokenizer, env)


def episode_formats_for(tokenizer: Any, env: Environment) -> dict[str | None, EpisodeFormat]:
    """The format of each task `env` plays, by task name (`Environment.tasks`): one for a single
    task, one per task of a mixture (each with its own stop text and chat roles)."""
    return {name: episode_format_for(tokenizer, task) for name, task in env.tasks().items()}
