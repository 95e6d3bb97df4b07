"""The S3 backend of :mod:`.sources`: shards under ``s3://bucket/prefix`` through boto3.

Any S3-compatible endpoint works (SeaweedFS, MinIO, AWS): :class:`S3Config` says how to reach it.
:class:`S3Source` opens ranged GETs (stream.py resumes a dropped one with another), writes
shards with multipart uploads, and turns boto3's errors into ones that name the shard
(:meth:`S3Source.translate`). It builds its boto3 client lazily, once per process: DataLoader
workers are forked or spawned copies, and a client must not cross a fork.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable
from typing import Any

from .errors import (
    ManifestError,
    ManifestMismatchError,
    ShardNotFoundError,
    ShardReadError,
    StorageUnavailableError,
)
from .manifest import MANIFEST_NAME, Manifest
from .sources import (
    IncompleteResponseError,
    RangeReader,
    ShardSink,
    _client_error_code,
    is_transient,
    require_finite_fields,
)

__all__ = ["S3Config", "S3Source"]


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
