"""Where shards live: a local directory or ``s3://bucket/prefix`` (boto3, endpoint configurable).

A source opens byte ranges of named shards and writes new ones; it knows nothing of tar, the
cache or retries (those live in :mod:`.stream`). Its one other job is to turn the storage's
errors into ones that name the shard: a missing bucket, a missing key, a range past the end.
It also sorts failures into *transient* (retry: a dropped connection, a timeout, a 5xx while
a server restarts) and *permanent* (raise now: 404, 403) via :func:`is_transient`.

Sources are picklable and build their boto3 client lazily, once per process: DataLoader
workers are forked or spawned copies, and a client must not cross a fork.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import math
import mmap
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .errors import (
    DataError,
    ManifestError,
    ManifestMismatchError,
    ShardNotFoundError,
    ShardReadError,
    StorageUnavailableError,
)
from .manifest import MANIFEST_NAME, Manifest

__all__ = [
    "LocalSource",
    "RangeReader",
    "S3Config",
    "S3Source",
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


# --------------------------------------------------------------------------- S3
@dataclasses.dataclass(frozen=True, kw_only=True)
class S3Config:
    """How to reach the object store. Credentials default to boto3's usual chain (env vars,
    ~/.aws); give them here for a test server."""

    endpoint_url: str | None = None
    """``http://127.0.0.1:8333`` for SeaweedFS/MinIO; None for AWS itself."""
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = dataclasses.field(default=None, repr=False)
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    """A read that stalls this long is a failure (then resumed with a ranged GET)."""
    max_pool_connections: int = 32
    """>= prefetch streams per process, or boto3 blocks waiting for a pooled connection."""
    addressing_style: str = "path"
    """``path`` works for an IP endpoint; ``virtual`` for AWS-style bucket host names."""
    multipart_part_size: int = 8 << 20
    """Writer: upload parts of this size (S3 needs >= 5 MiB for every part but the last)."""

    def __post_init__(self) -> None:
        require_finite_fields(self)
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError(
                "connect_timeout_s and read_timeout_s must be > 0, got "
                f"{self.connect_timeout_s} and {self.read_timeout_s}"
            )
        if self.max_pool_connections < 1:
            raise ValueError(f"max_pool_connections must be >= 1, got {self.max_pool_connections}")
        if self.addressing_style not in ("path", "virtual", "auto"):
            raise ValueError(
                "addressing_style must be 'path', 'virtual' or 'auto', got "
                f"{self.addressing_style!r}"
            )
        if self.multipart_part_size < 5 << 20:
            raise ValueError(
                "multipart_part_size must be >= 5 MiB (S3's minimum part), got "
                f"{self.multipart_part_size}"
            )
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("give access_key_id and secret_access_key together, or neither")


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


class _S3Range:
    def __init__(self, response: dict[str, Any], start: int) -> None:
        body = response["Body"]
        # The urllib3 response under botocore's StreamingBody: read(n) straight from it saves
        # a layer of Python per chunk (~10% at 1 GB/s). A reset raises (ProtocolError); a body
        # ended early by a FIN may just return b"": the stream counts bytes against the
        # object's size and resumes either way.
        self._body = body
        self._raw = getattr(body, "_raw_stream", body)
        # "bytes 100-999/1000". A response cut inside its headers still parses (http.client
        # stops at EOF) but lacks them: retry it like a cut body. A 200 to a ranged GET (a
        # server ignoring Range) would hand us bytes from 0 as if from ``start``: refuse it.
        content_range = response.get("ContentRange")
        length = response.get("ContentLength")
        if content_range:
            try:
                span, total = content_range.removeprefix("bytes ").split("/")
                first = int(span.split("-")[0])
                self.total_size = int(total)
            except ValueError:
                raise IncompleteResponseError(
                    f"malformed Content-Range {content_range!r}"
                ) from None
            if first != start:
                raise IncompleteResponseError(
                    f"asked for bytes from {start}, got Content-Range {content_range!r}"
                )
        elif start == 0 and length is not None:
            self.total_size = int(length)
        else:
            raise IncompleteResponseError(
                f"response to GET Range: bytes={start}- has no Content-Range"
                + ("" if length is not None else " and no Content-Length (headers cut?)")
            )

    def read(self, n: int) -> bytes:
        return self._raw.read(n)

    def close(self) -> None:
        self._body.close()


class _S3Sink:
    """Multipart upload: parts go out as the shard grows, so a shard is never buffered
    whole; small shards (< one part) are a single PUT. Aborted on failure."""

    def __init__(self, source: S3Source, key: str) -> None:
        self._source = source
        self._key = key
        self._part_size = source.config.multipart_part_size
        self._buf = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []

    def write(self, data: bytes | memoryview) -> None:
        self._buf += data
        while len(self._buf) >= self._part_size:
            try:
                self._upload_part(bytes(self._buf[: self._part_size]))
            except Exception as exc:
                self.abort()
                raise self._source.translate(exc, self._key, writing=True) from exc
            del self._buf[: self._part_size]

    def _upload_part(self, data: bytes) -> None:
        client = self._source.client()
        if self._upload_id is None:
            self._upload_id = client.create_multipart_upload(
                Bucket=self._source.bucket, Key=self._key
            )["UploadId"]
        number = len(self._parts) + 1
        etag = client.upload_part(
            Bucket=self._source.bucket,
            Key=self._key,
            PartNumber=number,
            UploadId=self._upload_id,
            Body=data,
        )["ETag"]
        self._parts.append({"PartNumber": number, "ETag": etag})

    def commit(self) -> None:
        client = self._source.client()
        try:
            if self._upload_id is None:
                client.put_object(Bucket=self._source.bucket, Key=self._key, Body=bytes(self._buf))
            else:
                if self._buf:
                    self._upload_part(bytes(self._buf))
                client.complete_multipart_upload(
                    Bucket=self._source.bucket,
                    Key=self._key,
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": self._parts},
                )
        except Exception as exc:
            self.abort()
            raise self._source.translate(exc, self._key, writing=True) from exc
        self._buf = bytearray()

    def abort(self) -> None:
        if self._upload_id is not None:
            # Best effort: the original error matters more.
            with contextlib.suppress(Exception):
                self._source.client().abort_multipart_upload(
                    Bucket=self._source.bucket, Key=self._key, UploadId=self._upload_id
                )
            self._upload_id = None


class S3Source:
    """Shards as objects under ``s3://bucket/prefix/``."""

    def __init__(
        self,
        url: str,
        config: S3Config | None = None,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        if not url.startswith("s3://"):
            raise ValueError(f"an S3 source URL looks like s3://bucket/prefix, got {url!r}")
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if len(bucket) < 3:
            raise ValueError(f"bucket name must have >= 3 characters, got {bucket!r} in {url!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.config = config or S3Config()
        self._client_factory = client_factory
        self._client: Any = None
        self._client_pid = -1
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3Source({self.url!r}, endpoint={self.config.endpoint_url!r})"

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages: the configured URL, or AWS's own endpoint."""
        return self.config.endpoint_url or f"AWS S3 (region {self.config.region})"

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "config": self.config, "client_factory": self._client_factory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["config"], state["client_factory"])  # type: ignore[misc]

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def location(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.key(name)}"

    def client(self) -> Any:
        """This process's client (boto3 clients are thread-safe; not fork-safe)."""
        pid = os.getpid()
        if self._client is None or self._client_pid != pid:
            with self._lock:
                if self._client is None or self._client_pid != pid:
                    self._client = (self._client_factory or self._make_client)()
                    self._client_pid = pid
        return self._client

    def reset_client(self) -> None:
        """Drop pooled connections (a test changes what a proxy does to new ones)."""
        with self._lock:
            self._client = None

    def _make_client(self) -> Any:
        import boto3
        from botocore.config import Config

        c = self.config
        creds = {}
        if c.access_key_id is not None:
            creds = {
                "aws_access_key_id": c.access_key_id,
                "aws_secret_access_key": c.secret_access_key,
            }
        return boto3.client(
            "s3",
            endpoint_url=c.endpoint_url,
            region_name=c.region,
            config=Config(
                connect_timeout=c.connect_timeout_s,
                read_timeout=c.read_timeout_s,
                max_pool_connections=c.max_pool_connections,
                # One place decides about retries (stream.RetryPolicy): botocore's own retries
                # would multiply its bound and cannot resume a body cut mid-read anyway.
                retries={"total_max_attempts": 1},
                s3={"addressing_style": c.addressing_style},
            ),
            **creds,
        )

    def translate(self, exc: BaseException, key: str, *, writing: bool = False) -> BaseException:
        """A storage error as one naming the object. Transient errors of reads are returned
        unchanged (the caller retries them); those of writes, which nothing retries, become
        :class:`StorageUnavailableError` naming the endpoint."""
        import botocore.exceptions as bce

        if writing and is_transient(exc):
            return StorageUnavailableError(
                f"writing s3://{self.bucket}/{key}: the storage at {self.endpoint} failed "
                f"({type(exc).__name__}: {exc}); writes are not retried: check that the "
                "server is up and that S3Config.endpoint_url is right, then write again"
            )
        if not isinstance(exc, bce.ClientError):
            return exc
        code, status = _client_error_code(exc)
        where = f"s3://{self.bucket}/{key}"
        if code == "NoSuchBucket":
            return ShardNotFoundError(
                f"{where}: bucket {self.bucket!r} does not exist at {self.endpoint}; check the "
                "URL (s3://bucket/prefix) and the endpoint"
            )
        if code in ("NoSuchKey", "404", "NotFound") or status == 404:
            return ShardNotFoundError(
                f"{where} does not exist; the manifest lists it: re-upload it or rebuild the "
                "manifest with build_manifest()"
            )
        if code == "InvalidRange" or status == 416:
            return ManifestMismatchError(
                f"{where}: the requested range starts past the object's end (HTTP 416); the "
                "object is shorter than the manifest says: rebuild the manifest"
            )
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            verb = "write" if writing else "read"
            return ShardReadError(
                f"{where}: access denied ({code}); check the credentials that may {verb} it"
            )
        return exc

    def open_range(self, name: str, start: int) -> RangeReader:
        key = self.key(name)
        try:
            response = self.client().get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={start}-"
            )
        except Exception as exc:
            raise self.translate(exc, key) from exc
        try:
            return _S3Range(response, start)
        except Exception:
            response["Body"].close()
            raise

    def list_shards(self) -> list[str]:
        prefix = f"{self.prefix}/" if self.prefix else ""
        names: list[str] = []
        try:
            paginator = self.client().get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    if obj["Key"].endswith(".tar"):
                        names.append(obj["Key"][len(prefix) :])
        except Exception as exc:
            raise self.translate(exc, prefix) from exc
        return sorted(names)

    def read_all(self, name: str) -> bytes:
        key = self.key(name)
        try:
            return self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except Exception as exc:
            raise self.translate(exc, key) from exc

    def read_manifest(self) -> Manifest:
        import botocore.exceptions as bce

        key = self.key(MANIFEST_NAME)
        try:
            data = self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except bce.ClientError as exc:
            code, status = _client_error_code(exc)
            if code != "NoSuchBucket" and (code == "NoSuchKey" or status == 404):
                raise ManifestError(
                    f"no {MANIFEST_NAME} under {self.url}; write shards with ShardWriter, or "
                    "make one for existing shards with build_manifest(source)"
                ) from None
            raise self.translate(exc, key) from exc
        return Manifest.from_json(data, where=self.location(MANIFEST_NAME))

    def create(self, name: str) -> ShardSink:
        return _S3Sink(self, self.key(name))

    def put_bytes(self, name: str, data: bytes) -> None:
        key = self.key(name)
        try:
            self.client().put_object(Bucket=self.bucket, Key=key, Body=data)
        except Exception as exc:
            raise self.translate(exc, key, writing=True) from exc


def open_source(source: Any, s3: S3Config | None = None) -> Source:
    """A :class:`Source` from ``s3://bucket/prefix``, a local path, or a Source (returned as is)."""
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
