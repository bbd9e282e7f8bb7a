"""Reference sources: where the decoupled loss gets pi_ref (see DESIGN.md, "reference source")."""

from lit_asyncrl.reference.base import ReferenceSource
from lit_asyncrl.reference.simple import AsyncRecomputeReference, NoReference
from lit_asyncrl.reference.registry import available_references, build_reference

__all__ = ["AsyncRecomputeReference", "NoReference", "ReferenceSource", "available_references", "build_reference"]
