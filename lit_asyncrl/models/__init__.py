"""Policy construction: a local Hugging Face model folder, or the built-in tiny policy."""

from lit_asyncrl.models.resolve import resolve_model_path
from lit_asyncrl.models.tiny import TinyPolicyConfig, build_tiny_policy

__all__ = ["TinyPolicyConfig", "build_tiny_policy", "resolve_model_path"]
