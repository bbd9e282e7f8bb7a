"""Environments: the protocol and the built-in tasks."""

from lit_asyncrl.envs.base import Environment, Episode, StepResult
from lit_asyncrl.envs.guess_number import GuessNumberEnv

__all__ = ["Environment", "Episode", "GuessNumberEnv", "StepResult"]
