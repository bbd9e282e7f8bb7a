"""Reference sources by short name (the `reference=<name>` config group uses the same names)."""

from __future__ import annotations

from typing import Any

from lit_asyncrl.reference.attached import DedicatedReference, InterruptSyncReference
from lit_asyncrl.reference.base import ReferenceSource
from lit_asyncrl.reference.ewma import EWMAReferenceSource
from lit_asyncrl.reference.simple import AsyncRecomputeReference, NoReference
from lit_asyncrl.reference.snapshot import SnapshotReference

_REFERENCES: dict[str, type] = {
    "none": NoReference,
    "async_recompute": AsyncRecomputeReference,
    "snapshot": SnapshotReference,
    "ewma": EWMAReferenceSource,
    "interrupt_sync": InterruptSyncReference,
    "dedicated": DedicatedReference,
}


def available_references() -> list[str]:
    return sorted(_REFERENCES)


def reference_name(reference: ReferenceSource) -> str:
    """The `reference=<name>` a source is built by (its class name for a source of one's own)."""
    names = [name for name, cls in _REFERENCES.items() if type(reference) is cls]
    return names[0] if names else type(reference).__name__


def build_reference(name: str, **kwargs: Any) -> ReferenceSource:
    """Build a reference source; unknown names and arguments fail naming the key."""
    if name not in _REFERENCES:
        raise ValueError(f"model.reference={name!r} is not one of {available_references()}")
    try:
        return _REFERENCES[name](**kwargs)
    except TypeError as error:
        raise ValueError(f"model.reference={name!r}: {error}") from error
