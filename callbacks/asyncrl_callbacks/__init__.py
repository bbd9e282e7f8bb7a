"""Reusable Lightning callbacks for off-policy reference policies (no vLLM, Hydra or lit_asyncrl needed)."""

from asyncrl_callbacks.ewma import EWMAReference
from asyncrl_callbacks.interruption_sync import InterruptibleRollouts, InterruptionSync
from asyncrl_callbacks.snapshot import SnapshotRetention

__all__ = ["EWMAReference", "InterruptibleRollouts", "InterruptionSync", "SnapshotRetention"]
