"""Errors of the tracking component. Each message names the bad value and how to fix it."""

from __future__ import annotations

__all__ = [
    "ArtifactError",
    "FilterError",
    "IntegrityError",
    "NotFoundError",
    "PermissionDeniedError",
    "TrackingError",
]


class TrackingError(Exception):
    """Base class: anything the tracking component refuses or cannot do."""


class FilterError(TrackingError, ValueError):
    """A search filter that does not parse or does not type-check; ``position`` is the
    character offset of the problem in the filter text (or None)."""

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


class NotFoundError(TrackingError, LookupError):
    """A project, run, artifact, user or lineage node that does not exist."""


class PermissionDeniedError(TrackingError):
    """The caller's token does not grant the permission this operation needs."""


class ArtifactError(TrackingError):
    """Artifact bytes that are missing, damaged (sha256 mismatch) or refused (a bad name)."""


class IntegrityError(TrackingError):
    """A write that would break an invariant of the store (e.g. a reference to missing bytes)."""
