"""Write samples as tar shards in WebDataset layout, cut at a target size, plus a manifest.

    config = WriterConfig(target_shard_bytes=64 << 20)
    with ShardWriter("s3://bucket/imagenet/train", config, s3=S3Config(endpoint_url=...)) as w:
        for i, (jpg, label) in enumerate(pairs):
            w.write({"__key__": f"{i:08d}", "jpg": jpg, "cls": str(label)})
    # -> shard-000000.tar, shard-000001.tar, ..., manifest.json

A shard is cut *before* the sample that would push it past ``target_shard_bytes`` (so shards
stay at or under the target unless one sample alone is larger: then it gets a shard of its
own). Output is deterministic (fixed mtime, owner and mode in every header): the same samples
give byte-identical shards and the same sha256, so re-running a writer is idempotent. Shards
are streamed out as they grow (an S3 multipart upload, or a temp file renamed on commit):
nothing is visible under a shard's name until it is complete, and the manifest is written
last, so a reader never sees a half-written dataset.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

from .manifest import MANIFEST_NAME, Manifest, ShardInfo
from .s3 import S3Config
from .sources import ShardSink, Source, open_source
from .tario import END_OF_ARCHIVE, sample_bytes, split_key

__all__ = ["ShardWriter", "WriterConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class WriterConfig:
    """How shards are cut and named."""

    target_shard_bytes: int = 64 << 20
    """Cut a shard before it would exceed this. 64 MiB: large enough that per-object request
    latency (~2-8 ms on loopback, tens of ms on real S3) is amortised, small enough that
    many shards keep ranks and workers balanced and a cache holds a useful number of them."""
    name_pattern: str = "shard-{index:06d}.tar"
    """``str.format`` pattern with ``{index}``; may contain '/' for sub-folders."""
    mtime: int = 0
    """Header mtime of every member: fixed so output bytes do not depend on the clock."""

    def __post_init__(self) -> None:
        if self.target_shard_bytes < 10 * 1024:
            raise ValueError(
                f"target_shard_bytes must be >= 10240 (tar headers alone take 512 bytes per "
                f"member), got {self.target_shard_bytes}"
            )
        try:
            a, b = self.name_pattern.format(index=0), self.name_pattern.format(index=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"name_pattern must be a str.format pattern using only {{index}}, got "
                f"{self.name_pattern!r} ({exc})"
            ) from None
        if a == b or not a.endswith(".tar"):
            raise ValueError(
                "name_pattern must contain {index} and end with '.tar', "
                f"got {self.name_pattern!r}"
            )
        if self.mtime < 0:
            raise ValueError(f"mtime must be >= 0, got {self.mtime}")


_EXT = re.compile(r"^[^/]+$")


def _encode_fields(sample: dict[str, Any]) -> tuple[str, dict[str, bytes]]:
    if "__key__" not in sample:
        raise ValueError(f"a sample needs a '__key__' entry; got keys {sorted(sample)}")
    key = sample["__key__"]
    if not isinstance(key, str) or split_key(f"{key}.x") != (key, "x"):
        raise ValueError(
            f"sample key {key!r} must be a non-empty string whose last path component has no "
            "'.' (readers split KEY.EXT at the first dot) and does not start with '.'"
        )
    fields: dict[str, bytes] = {}
    for ext, value in sample.items():
        if isinstance(ext, str) and ext.startswith("__"):
            continue  # metadata such as __key__, __shard__: not stored, as in webdataset
        if not isinstance(ext, str) or not _EXT.match(ext) or ext != ext.lower():
            raise ValueError(
                f"sample {key!r}: extension {ext!r} must be a non-empty lower-case string "
                "without '/' (readers lower-case extensions, as webdataset does)"
            )
        if isinstance(value, str):
            value = value.encode()
        elif isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        elif not isinstance(value, bytes):
            raise TypeError(
                f"sample {key!r}: field {ext!r} must be bytes or str, got "
                f"{type(value).__name__}; encode it first (e.g. numpy: .tobytes(), json.dumps)"
            )
        fields[ext] = value
    if not fields:
        raise ValueError(f"sample {key!r} has no fields besides metadata")
    return key, fields


class ShardWriter:
    """Append samples; shards are cut and uploaded as they fill; ``close()`` writes the manifest."""

    def __init__(
        self, destination: Any, config: WriterConfig | None = None, *, s3: S3Config | None = None
    ) -> None:
        self.config = config or WriterConfig()
        self.source: Source = open_source(destination, s3)
        self.shards: list[ShardInfo] = []
        self._sink: ShardSink | None = None
        self._name = ""
        self._size = 0
        self._count = 0
        self._hash = hashlib.sha256()
        self._last_key: str | None = None
        self._closed = False

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write(self, sample: dict[str, Any]) -> None:
        """Add one sample (``{"__key__": str, ext: bytes | str, ...}``)."""
        if self._closed:
            raise ValueError("this ShardWriter is closed")
        key, fields = _encode_fields(sample)
        if key == self._last_key:
            # Two consecutive samples with one key would be read back as one sample.
            raise ValueError(f"sample key {key!r} repeats the previous sample's key")
        parts = sample_bytes(key, fields, mtime=self.config.mtime)
        nbytes = sum(len(p) for p in parts)
        if (
            self._sink is not None
            and self._count
            and (self._size + nbytes + len(END_OF_ARCHIVE) > self.config.target_shard_bytes)
        ):
            self._finish_shard()
        if self._sink is None:
            self._name = self.config.name_pattern.format(index=len(self.shards))
            self._sink = self.source.create(self._name)
            self._size, self._count, self._hash = 0, 0, hashlib.sha256()
        for part in parts:
            self._sink.write(part)
            self._hash.update(part)
        self._size += nbytes
        self._count += 1
        self._last_key = key

    def _finish_shard(self) -> None:
        assert self._sink is not None
        self._sink.write(END_OF_ARCHIVE)
        self._hash.update(END_OF_ARCHIVE)
        self._sink.commit()
        self.shards.append(
            ShardInfo(
                name=self._name,
                size=self._size + len(END_OF_ARCHIVE),
                num_samples=self._count,
                sha256=self._hash.hexdigest(),
            )
        )
        self._sink = None
        self._last_key = None

    def close(self) -> Manifest:
        """Finish the last shard and write ``manifest.json``; returns the manifest."""
        if self._closed:
            return Manifest(tuple(self.shards))
        if self._sink is not None:
            self._finish_shard()
        manifest = Manifest(tuple(self.shards))
        self.source.put_bytes(MANIFEST_NAME, manifest.to_json().encode())
        self._closed = True
        return manifest

    def abort(self) -> None:
        """Drop the shard in progress (finished shards stay; no manifest is written)."""
        if self._sink is not None:
            self._sink.abort()
            self._sink = None
        self._closed = True
