"""Reference sources by config name (`reference=<name>`)."""

from __future__ import annotations

from lit_asyncrl.reference.base import ReferenceSource
from lit_asyncrl.reference.simple import AsyncRecomputeReference, NoReference

_REFERENCES: dict[str, type] = {"none": NoReference, "async_recompute": AsyncRecomputeReference}


def available_references() -> list[str]:
    return sorted(_REFERENCES)


def build_reference(name: str) -> ReferenceSource:
    if name not in _REFERENCES:
        raise ValueError(f"model.reference={name!r} is not one of {available_references()}")
    return _REFERENCES[name]()
