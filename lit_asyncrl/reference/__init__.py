"""Reference sources: where the decoupled loss gets pi_ref (see docs/method.md, sections 3 to 6)."""

from lit_asyncrl.reference.attached import DedicatedReference, InterruptSyncReference
from lit_asyncrl.reference.base import ReferenceSource
from lit_asyncrl.reference.ewma import EWMAReferenceSource
from lit_asyncrl.reference.registry import available_references, build_reference
from lit_asyncrl.reference.simple import AsyncRecomputeReference, NoReference
from lit_asyncrl.reference.snapshot import SnapshotReference

__all__ = [
    "AsyncRecomputeReference",
    "DedicatedReference",
    "EWMAReferenceSource",
    "InterruptSyncReference",
    "NoReference",
    "ReferenceSource",
    "SnapshotReference",
    "available_references",
    "build_reference",
]
