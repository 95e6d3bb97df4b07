"""Errors of the streaming dataset. Each names the shard (and the source) it is about and says
what to do, so that a failure in a worker process deep in a training job is actionable from
its one-line message."""

from __future__ import annotations

__all__ = [
    "DataError",
    "ManifestError",
    "ManifestMismatchError",
    "ShardFormatError",
    "ShardNotFoundError",
    "ShardReadError",
    "StorageUnavailableError",
]


class DataError(Exception):
    """Base class of every error raised by :mod:`reference_impls.data`."""


class ShardNotFoundError(DataError):
    """A bucket, an object or a local file named by the manifest does not exist."""


class ShardReadError(DataError):
    """Reading a shard failed and bounded retries with backoff did not get it back."""


class StorageUnavailableError(DataError):
    """The storage did not answer (endpoint unreachable, connections cut, timeouts, 5xx):
    reading a manifest, after the configured retries, or writing (never retried). Reading a
    shard's bytes raises :class:`ShardReadError` instead. The message names the endpoint and
    the last error."""


class ShardFormatError(DataError):
    """A shard is not a well-formed tar in WebDataset layout (truncated, corrupt header,
    duplicate member in one sample)."""


class ManifestError(DataError):
    """The manifest itself is missing or malformed."""


class ManifestMismatchError(ManifestError):
    """The manifest disagrees with the objects it describes (size, sample count, sha256)."""
