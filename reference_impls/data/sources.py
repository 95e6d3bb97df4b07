"""Where shards live: a local directory (here) or ``s3://bucket/prefix`` (s3.py: boto3, endpoint
configurable), behind one :class:`Source` protocol.

A source opens byte ranges of named shards and writes new ones; it knows nothing of tar, the
cache or retries (those live in :mod:`.stream`). Its one other job is to turn the storage's
errors into ones that name the shard: a missing bucket, a missing key, a range past the end.
It also sorts failures into *transient* (retry: a dropped connection, a timeout, a 5xx while
a server restarts) and *permanent* (raise now: 404, 403) via :func:`is_transient`.

Sources are picklable: DataLoader workers are forked or spawned copies. The S3 backend's
names (``S3Config``, ``S3Source``) stay importable from here.
"""

from __future__ import annotations

import dataclasses
import http.client
import math
import mmap
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .errors import (
    DataError,
    ManifestError,
    ManifestMismatchError,
    ShardNotFoundError,
)
from .manifest import MANIFEST_NAME, Manifest

if TYPE_CHECKING:
    from .s3 import S3Config

__all__ = [
    "IncompleteResponseError",
    "LocalSource",
    "RangeReader",
    "ShardSink",
    "Source",
    "is_transient",
    "open_source",
]


class RangeReader(Protocol):
    """An open byte range: ``read(n)`` returns up to n bytes, ``b""`` at the end."""

    total_size: int

    def read(self, n: int) -> bytes: ...

    def close(self) -> None: ...


class ShardSink(Protocol):
    """A shard being written; nothing is visible under its name before ``commit()``."""

    def write(self, data: bytes | memoryview) -> None: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...


class Source(Protocol):
    url: str

    def open_range(self, name: str, start: int) -> RangeReader: ...

    def list_shards(self) -> list[str]: ...

    def read_all(self, name: str) -> bytes: ...

    def read_manifest(self) -> Manifest: ...

    def create(self, name: str) -> ShardSink: ...

    def put_bytes(self, name: str, data: bytes) -> None: ...

    def location(self, name: str) -> str: ...


# --------------------------------------------------------------------------- local
class _LocalRange:
    def __init__(self, path: Path, start: int) -> None:
        self._f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by close()
        self.total_size = os.fstat(self._f.fileno()).st_size
        self._f.seek(start)

    def read(self, n: int) -> bytes:
        return self._f.read(n)

    def close(self) -> None:
        self._f.close()


class _LocalSink:
    """A temp file in the destination directory, renamed into place on commit (atomic)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
        self._tmp = Path(tmp)
        self._f = os.fdopen(fd, "wb")

    def write(self, data: bytes | memoryview) -> None:
        self._f.write(data)

    def commit(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self._path)

    def abort(self) -> None:
        self._f.close()
        self._tmp.unlink(missing_ok=True)


class LocalSource:
    """Shards as files under one directory (``/data/ds`` or ``file:///data/ds``)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        root = os.fspath(root)
        if root.startswith("file://"):
            root = root[len("file://") :]
        self.root = Path(root)
        self.url = str(self.root)

    def __repr__(self) -> str:
        return f"LocalSource({self.url!r})"

    def location(self, name: str) -> str:
        return str(self.root / name)

    def _path(self, name: str) -> Path:
        path = self.root / name
        if not path.is_file():
            if not self.root.is_dir():
                raise ShardNotFoundError(
                    f"shard {name!r}: the dataset directory {self.url} does not exist"
                )
            raise ShardNotFoundError(f"shard {name!r}: {path} does not exist")
        return path

    def open_range(self, name: str, start: int) -> RangeReader:
        return _LocalRange(self._path(name), start)

    def map_shard(self, name: str) -> mmap.mmap:
        """The whole file mapped read-only (pages mapped up front where the OS can)."""
        with open(self._path(name), "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise ManifestMismatchError(f"shard {name!r}: {self.root / name} is empty")
            populate = getattr(mmap, "MAP_POPULATE", 0)
            return mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)

    def list_shards(self) -> list[str]:
        if not self.root.is_dir():
            raise ShardNotFoundError(f"the dataset directory {self.url} does not exist")
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*.tar"))

    def read_all(self, name: str) -> bytes:
        return self._path(name).read_bytes()

    def read_manifest(self) -> Manifest:
        path = self.root / MANIFEST_NAME
        if not path.is_file():
            raise ManifestError(
                f"no {MANIFEST_NAME} in {self.url}; write shards with ShardWriter, or make one "
                "for existing shards with build_manifest(source) and write it next to them"
            )
        return Manifest.from_json(path.read_bytes(), where=str(path))

    def create(self, name: str) -> ShardSink:
        return _LocalSink(self.root / name)

    def put_bytes(self, name: str, data: bytes) -> None:
        sink = self.create(name)
        sink.write(data)
        sink.commit()

    def __getstate__(self) -> dict[str, Any]:
        return {"root": str(self.root)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"])  # type: ignore[misc]


def require_finite_fields(config: Any) -> None:
    """Raise ValueError for a float field of the dataclass ``config`` that is NaN or infinite.

    Range checks cannot do it: NaN fails every comparison (``nan <= 0`` is False, so a NaN
    timeout passed "> 0"), and an infinite backoff or timeout waits for ever.
    """
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(
                f"{type(config).__name__}.{field.name} must be a finite number, got {value}"
            )


# --------------------------------------------------------------------------- errors
def _client_error_code(exc: BaseException) -> tuple[str, int]:
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


_TRANSIENT_CODES = {
    "SlowDown",
    "InternalError",
    "ServiceUnavailable",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "503",
    "500",
}


class IncompleteResponseError(Exception):
    """A response without the headers a ranged GET needs (cut mid-headers): retried."""


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same request can succeed: connection and read failures, timeouts,
    and 5xx/throttling answers. A 404, 403 or a malformed request cannot."""
    if isinstance(exc, DataError):
        return False
    if isinstance(exc, IncompleteResponseError):
        return True
    import botocore.exceptions as bce
    import urllib3.exceptions as u3e

    if isinstance(exc, bce.ClientError):
        code, status = _client_error_code(exc)
        return status >= 500 or code in _TRANSIENT_CODES
    # HTTPClientError covers ConnectionClosedError and ReadTimeoutError (which are not
    # botocore ConnectionErrors); urllib3's HTTPError what a raw body read raises.
    return isinstance(
        exc,
        (
            bce.ConnectionError,
            bce.HTTPClientError,
            bce.ResponseStreamingError,
            bce.IncompleteReadError,
            u3e.HTTPError,
            http.client.HTTPException,
            OSError,
        ),
    )


def open_source(source: Any, s3: S3Config | None = None) -> Source:
    """A :class:`Source` from ``s3://bucket/prefix``, a local path, or a Source (returned as is)."""
    from .s3 import S3Source  # here: s3.py builds on this module

    if isinstance(source, (LocalSource, S3Source)):
        return source
    if hasattr(source, "open_range") and hasattr(source, "read_manifest"):
        return source  # any object following the Source protocol
    text = os.fspath(source)
    if text.startswith("s3://"):
        return S3Source(text, s3)
    if "://" in text and not text.startswith("file://"):
        raise ValueError(f"unsupported source {text!r}: use s3://bucket/prefix or a local path")
    return LocalSource(text)


_S3_NAMES = frozenset({"S3Config", "S3Source", "_S3Range", "_S3Sink"})


def __getattr__(name: str) -> Any:
    # The S3 backend lives in s3.py (which imports this module): its names are looked up
    # there on first use, so `from reference_impls.data.sources import S3Config` still works.
    if name in _S3_NAMES:
        from . import s3

        return getattr(s3, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
