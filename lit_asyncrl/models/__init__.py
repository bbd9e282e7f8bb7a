"""Policy construction: a local Hugging Face model folder, or a built-in tiny policy (dense or MoE)."""

from lit_asyncrl.models.resolve import resolve_model_path
from lit_asyncrl.models.tiny import TinyPolicyConfig, build_tiny_policy
from lit_asyncrl.models.tiny_moe import TinyMoEConfig, build_tiny_moe

__all__ = ["TinyMoEConfig", "TinyPolicyConfig", "build_tiny_moe", "build_tiny_policy", "resolve_model_path"]
