"""Reusable Lightning callbacks for off-policy reference policies (no vLLM, Hydra or lit_asyncrl needed).

The callbacks are imported on first use (PEP 562): a process that needs only a helper module
(`asyncrl_callbacks.eval_mode` in a scoring worker, `asyncrl_callbacks.snapshot_store`) does not
import Lightning for it (measured: 4.6 s of a spawned old-logit worker's 7.5 s of imports).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncrl_callbacks.ewma import EWMAReference
    from asyncrl_callbacks.interrupt_sync import InterruptibleRollouts, InterruptSync
    from asyncrl_callbacks.snapshot import SnapshotRetention

#: Each exported name and the module that defines it. `InterruptionSync`, the name before 2026-12-03,
#: is kept so that code written against it still runs.
_DEFINED_IN = {
    "EWMAReference": ("asyncrl_callbacks.ewma", "EWMAReference"),
    "InterruptibleRollouts": ("asyncrl_callbacks.interrupt_sync", "InterruptibleRollouts"),
    "InterruptSync": ("asyncrl_callbacks.interrupt_sync", "InterruptSync"),
    "InterruptionSync": ("asyncrl_callbacks.interrupt_sync", "InterruptSync"),
    "SnapshotRetention": ("asyncrl_callbacks.snapshot", "SnapshotRetention"),
}

__all__ = ["EWMAReference", "InterruptibleRollouts", "InterruptSync", "InterruptionSync", "SnapshotRetention"]


def __getattr__(name: str) -> Any:
    if name not in _DEFINED_IN:
        raise AttributeError(f"module 'asyncrl_callbacks' has no attribute {name!r}")
    module_name, attribute = _DEFINED_IN[name]
    value = getattr(import_module(module_name), attribute)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
