"""Reusable Lightning callbacks for off-policy reference policies (no vLLM, Hydra or lit_asyncrl needed)."""

from asyncrl_callbacks.ewma import EWMAReference

__all__ = ["EWMAReference"]
