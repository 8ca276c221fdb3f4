"""Sources by name, so a plan's ``source`` field finds the code that runs it."""
from __future__ import annotations

from .base import AlgorithmSource

_SOURCES: dict[str, AlgorithmSource] = {}


def register(source: AlgorithmSource) -> None:
    _SOURCES[source.name] = source


def get(name: str) -> AlgorithmSource:
    if not _SOURCES:
        from .legacy import LegacySource

        register(LegacySource())
    try:
        return _SOURCES[name]
    except KeyError:
        from ..errors import InputError

        raise InputError(f"unknown algorithm source {name!r}; known: {', '.join(sorted(_SOURCES))}", "source") from None
