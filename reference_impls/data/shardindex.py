"""Per-sample index of a cached shard: a cache hit reads each sample's members at known offsets
instead of parsing the tar's headers again.

A :class:`ShardIndex` lists each sample's key and, per member, its extension and the byte
range of its data in the tar. It is built by the tar parser itself (``iter_samples(...,
locate=True)``: the same rules for keys, extensions, skipped and metadata members, long names
and pax headers), so a sample read through the index is the sample that parsing yields:
``{"__key__": key, ext: bytes, ...}`` with the members in the same order.

Members of at most ``INLINE_MAX`` bytes (labels, small metadata) are also stored in the index
itself: reading one from the tar would cost a system call (or a page fault) for a few bytes,
as much as reading a 100 KB payload. The index's own SHA-256 covers them.

On disk (``<sha256>-<crc32>.idx`` beside ``<sha256>-<crc32>.tar``, written atomically by
:class:`~.cache.ShardCache`), little-endian::

    header   magic "MLHIDX01", tar size u64, tar CRC32 u32, tar sha256 (32 raw bytes),
             samples u32, members u32, extensions u32, inline limit u32
    counts   members of each sample, u32 each
    ext ids  extension of each member (into the extension table), u32 each
    starts   offset of each member's data in the tar, u64 each
    sizes    size of each member's data, u64 each
    keys     u32 length, then the keys joined by NUL (UTF-8, surrogateescape)
    exts     u32 length, then the extensions joined by NUL
    inline   u64 length, then the data of every member of <= inline limit bytes, in order
    trailer  SHA-256 of everything above (32 bytes)

:meth:`ShardIndex.decode` accepts a file only if its SHA-256 matches, it names the tar it sits
beside (size, CRC32, sha256) and every range lies in order inside the tar; anything else
(truncated, corrupt, stale, another version) is ``None`` and the caller rebuilds the index
from the tar. The tar's own bytes are checked (the cache's ``verify``) before its index is
used.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import ShardReadError
from .tario import iter_samples

__all__ = ["INDEX_MAGIC", "INLINE_MAX", "ShardIndex"]

INDEX_MAGIC = b"MLHIDX01"
INLINE_MAX = 256
_HEADER = struct.Struct("<8sQI32sIIII")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_DIGEST = 32
_MAX_U32 = 0xFFFFFFFF


class ShardIndex:
    """Where each sample's members lie in the tar.

    ``keys[i]`` is sample ``i``'s key and ``layouts[i]`` the extensions of its members, in
    order (equal layouts share one tuple). Members are numbered across the shard: member ``j``
    has ``sizes[j]`` bytes at ``starts[j]`` in the tar, and ``inline[j]`` is its data when it
    is at most ``INLINE_MAX`` bytes (else None). Flat lists on purpose: per-sample objects
    would be tens of thousands of objects per shard for the garbage collector to track.
    """

    __slots__ = ("keys", "layouts", "starts", "sizes", "inline")

    def __init__(
        self,
        keys: list[str],
        layouts: list[tuple[str, ...]],
        starts: list[int],
        sizes: list[int],
        inline: list[bytes | None],
    ) -> None:
        self.keys = keys
        self.layouts = layouts
        self.starts = starts
        self.sizes = sizes
        self.inline = inline

    def __len__(self) -> int:
        return len(self.keys)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardIndex) and all(
            getattr(self, name) == getattr(other, name) for name in self.__slots__
        )

    def __repr__(self) -> str:
        return f"ShardIndex({len(self.keys)} samples, {len(self.starts)} members)"

    def first_member(self, sample: int) -> int:
        """The shard-wide number of sample ``sample``'s first member."""
        layouts = self.layouts
        if layouts and all(layout is layouts[0] for layout in layouts[:sample]):
            return sample * len(layouts[0])
        return sum(map(len, layouts[:sample]))

    # ----------------------------------------------------------------------- building
    @classmethod
    def scan(cls, buf: Any, shard: str) -> ShardIndex:
        """The index of the whole tar in ``buf`` (any buffer). Raises
        :class:`~.errors.ShardFormatError` where parsing would."""
        view = memoryview(buf).cast("B")
        keys: list[str] = []
        layouts: list[tuple[str, ...]] = []
        starts: list[int] = []
        sizes: list[int] = []
        inline: list[bytes | None] = []
        shared: dict[tuple[str, ...], tuple[str, ...]] = {}
        try:
            for sample in iter_samples([view], shard, locate=True):
                items = iter(sample.items())
                _, key = next(items)  # "__key__" comes first; no extension can be "__key__"
                exts = []
                for ext, (off, size) in items:
                    exts.append(ext)
                    starts.append(off)
                    sizes.append(size)
                    inline.append(view[off : off + size].tobytes() if size <= INLINE_MAX else None)
                keys.append(key)
                layout = tuple(exts)
                layouts.append(shared.setdefault(layout, layout))
        finally:
            view.release()
        return cls(keys, layouts, starts, sizes, inline)

    def samples(self, fd: int, first: int, stop: int, where: str) -> Iterator[dict[str, Any]]:
        """Samples ``first`` to ``stop - 1`` read from ``fd`` (the tar's file) as the parser
        yields them: each member not stored inline is one ``pread`` (which releases the GIL).
        Raises :class:`~.errors.ShardReadError` naming ``where`` if the file shrank."""
        starts, sizes, inline = self.starts, self.sizes, self.inline
        j = self.first_member(first)
        for key, exts in zip(self.keys[first:stop], self.layouts[first:stop], strict=True):
            sample: dict[str, Any] = {"__key__": key}
            for ext in exts:
                value = inline[j]
                if value is None:
                    value = os.pread(fd, sizes[j], starts[j])
                    if len(value) != sizes[j]:
                        raise ShardReadError(
                            f"{where}: short read at byte {starts[j]}: the cached file shrank "
                            "while being read (it must not be modified in place); clear the cache"
                        )
                sample[ext] = value
                j += 1
            yield sample

    def read(self, fd: int, i: int) -> dict[str, Any]:
        """Sample ``i`` read from ``fd`` (the tar's file), as the parser yields it."""
        return next(self.samples(fd, i, i + 1, f"sample {i}"))

    # ----------------------------------------------------------------------- file format
    def encode(self, *, size: int, crc: int, sha256: str) -> bytes | None:
        """The index file for the tar it was built from; None when the keys or extensions
        cannot be stored exactly (a NUL inside one, or more than 2**32 - 1 of anything)."""
        keys = self.keys
        ext_ids: dict[str, int] = {}
        counts = [len(layout) for layout in self.layouts]
        ids = [ext_ids.setdefault(ext, len(ext_ids)) for layout in self.layouts for ext in layout]
        exts = list(ext_ids)
        try:
            keys_blob = "\0".join(keys).encode("utf-8", "surrogateescape")
            exts_blob = "\0".join(exts).encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            return None
        # Exactness: what decode() will split back out must be what was put in.
        if _split(keys_blob, len(keys)) != keys or _split(exts_blob, len(exts)) != exts:
            return None
        if max(len(keys), len(ids), len(keys_blob), len(exts_blob)) > _MAX_U32:
            return None
        inline_blob = b"".join(v for v in self.inline if v is not None)
        body = b"".join(
            [
                _HEADER.pack(
                    INDEX_MAGIC,
                    size,
                    crc,
                    bytes.fromhex(sha256),
                    len(keys),
                    len(ids),
                    len(exts),
                    INLINE_MAX,
                ),
                np.asarray(counts, dtype="<u4").tobytes(),
                np.asarray(ids, dtype="<u4").tobytes(),
                np.asarray(self.starts, dtype="<u8").tobytes(),
                np.asarray(self.sizes, dtype="<u8").tobytes(),
                _U32.pack(len(keys_blob)),
                keys_blob,
                _U32.pack(len(exts_blob)),
                exts_blob,
                _U64.pack(len(inline_blob)),
                inline_blob,
            ]
        )
        return body + hashlib.sha256(body).digest()

    @classmethod
    def decode(cls, data: bytes, *, size: int, crc: int, sha256: str) -> ShardIndex | None:
        """The index in ``data`` if it is intact and belongs to the tar (``size``, ``crc``,
        ``sha256``); None otherwise."""
        if len(data) < _HEADER.size + _DIGEST:
            return None
        body = memoryview(data)[:-_DIGEST]
        if hashlib.sha256(body).digest() != data[-_DIGEST:]:
            return None
        magic, tar_size, tar_crc, digest, n, m, e, limit = _HEADER.unpack_from(body)
        if (magic, tar_size, tar_crc, digest.hex()) != (INDEX_MAGIC, size, crc, sha256):
            return None
        pos = _HEADER.size
        if pos + 4 * n + 20 * m > len(body):
            return None
        counts = np.frombuffer(body, dtype="<u4", count=n, offset=pos)
        ids = np.frombuffer(body, dtype="<u4", count=m, offset=pos + 4 * n)
        starts = np.frombuffer(body, dtype="<u8", count=m, offset=pos + 4 * n + 4 * m)
        sizes = np.frombuffer(body, dtype="<u8", count=m, offset=pos + 4 * n + 12 * m)
        pos += 4 * n + 20 * m
        blobs = []
        for field in (_U32, _U32, _U64):
            if pos + field.size > len(body):
                return None
            (length,) = field.unpack_from(body, pos)
            pos += field.size
            if pos + length > len(body):
                return None
            blobs.append(body[pos : pos + length])
            pos += length
        if pos != len(body):
            return None
        keys_blob, exts_blob, inline_blob = blobs
        keys, exts = _split(bytes(keys_blob), n), _split(bytes(exts_blob), e)
        if keys is None or exts is None:
            return None
        # Every member in a sample; every range inside the tar, in order, not overlapping.
        if int(counts.sum(dtype=np.uint64)) != m:
            return None
        small = sizes <= limit
        if m:
            ends = starts + sizes
            if (
                int(ids.max()) >= e
                or bool((ends < starts).any())
                or int(ends[-1]) > size
                or bool((starts[1:] < ends[:-1]).any())
            ):
                return None
        if int(sizes[small].sum(dtype=np.uint64)) != len(inline_blob):
            return None
        # Layouts: one shared tuple when every sample has the same members (the usual case).
        k = int(counts[0]) if n else 0
        if n and k and bool((counts == k).all()) and bool((ids.reshape(n, k) == ids[:k]).all()):
            layouts = [tuple(exts[i] for i in ids[:k].tolist())] * n
        else:
            shared: dict[tuple[str, ...], tuple[str, ...]] = {}
            ext_of = [exts[i] for i in ids.tolist()]
            layouts = []
            at = 0
            for count in counts.tolist():
                layout = tuple(ext_of[at : at + count])
                layouts.append(shared.setdefault(layout, layout))
                at += count
        blob = inline_blob.tobytes()
        cuts = np.cumsum(sizes[small]).tolist()
        values = [blob[a:b] for a, b in zip([0, *cuts[:-1]], cuts, strict=False)]
        if len(values) == m:
            inline: list[bytes | None] = values  # type: ignore[assignment]
        else:
            inline = [None] * m
            for j, value in zip(np.flatnonzero(small).tolist(), values, strict=True):
                inline[j] = value
        return cls(keys, layouts, starts.tolist(), sizes.tolist(), inline)


def _split(blob: bytes, count: int) -> list[str] | None:
    if count == 0:
        return [] if not blob else None
    out = blob.decode("utf-8", "surrogateescape").split("\0")
    return out if len(out) == count else None
