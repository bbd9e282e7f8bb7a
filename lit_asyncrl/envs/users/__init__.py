"""Simulated users: the other side of an agent's conversation, scripted or played by a frozen model."""

from lit_asyncrl.envs.users.llm_user import LLMUser
from lit_asyncrl.envs.users.simulated import CooperativeUser, Message, ScriptedUser, SimulatedUser, UserGoal

__all__ = ["CooperativeUser", "LLMUser", "Message", "ScriptedUser", "SimulatedUser", "UserGoal"]
