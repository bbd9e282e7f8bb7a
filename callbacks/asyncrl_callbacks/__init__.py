"""Reusable Lightning callbacks for off-policy reference policies (no vLLM, Hydra or lit_asyncrl needed)."""

from asyncrl_callbacks.ewma import EWMAReference
from asyncrl_callbacks.interrupt_sync import InterruptibleRollouts, InterruptSync
from asyncrl_callbacks.snapshot import SnapshotRetention

#: The name before 2026-12-03, kept so that code written against it still runs.
InterruptionSync = InterruptSync

__all__ = ["EWMAReference", "InterruptibleRollouts", "InterruptSync", "InterruptionSync", "SnapshotRetention"]
