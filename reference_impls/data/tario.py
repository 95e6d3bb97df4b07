"""Tar in WebDataset layout: a lean streaming parser and a deterministic member writer.

Layout (the ``webdataset`` package's convention): a sample is a run of consecutive regular
members sharing a key, ``KEY.EXT``, where KEY is the path up to the first dot of the last
path component and EXT the rest (``a/b.seg.png`` -> key ``a/b``, ext ``seg.png``). Extensions
are lower-cased and members whose name has no such key, or that start with ``__x__``
(webdataset's metadata), are skipped, exactly as webdataset's ``group_by_keys`` does, so both
readers group the same bytes into the same samples.

Why not :mod:`tarfile`: it parses through a small-buffered file object, copies each member
twice and builds a ``TarInfo`` per member; on loopback S3 that, not the network, capped a
stream at ~315-377 MB/s (docs/platform.md). Here a header is one 512-byte slice of a large chunk
(a memoryview, no copy), member data is copied exactly once into the ``bytes`` the sample
holds, and skipped members are not copied at all.

Formats read: POSIX ustar (with the 155-byte name prefix), GNU (``L`` long names, base-256
sizes) and PAX (``x`` records for ``path`` and ``size``; ``g`` global headers are ignored, as
tarfile does for these keys). Every header's checksum is verified: a corrupt or truncated
shard is an error naming the shard and the byte offset, never a silently short sample.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterable, Iterator
from typing import Any
from zlib import adler32

from .errors import ShardFormatError

__all__ = [
    "BLOCK",
    "END_OF_ARCHIVE",
    "iter_samples",
    "member_bytes",
    "sample_bytes",
    "split_key",
]

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)  # two zero blocks end a tar archive (POSIX.1-1988)
_ZERO_BLOCK = bytes(BLOCK)
# webdataset.tariterators: metadata members such as "__index__" are skipped entirely.
_META = re.compile(r"__[^/]*__($|/)")
# A checksum is computed with its own 8-byte field read as spaces: 8 * ord(" ").
_CHKSUM_SPACES = 8 * 0x20
# The header checksum is the plain sum of its 512 bytes. Summing them in Python costs ~1.9 us
# per member (~40% of parsing); zlib.adler32 computes A = 1 + sum mod 65521 in C in ~0.2 us.
# A match mod 65521 is taken as a match (a header sum is < 130561, so a corrupt header passes
# only if its sum is off by exactly 65521 or 131042; any one- or two-byte change is caught);
# a mismatch is re-checked exactly, accepting the signed-char sum some old tars used, as
# tarfile does.
_ADLER_MOD = 65521


def _check_exactly(raw: bytes, stored: int, shard: str, offset: int) -> None:
    unsigned = sum(raw[:148]) + _CHKSUM_SPACES + sum(raw[156:])
    signed = unsigned - 256 * sum(1 for b in raw[:148] + raw[156:] if b >= 128)
    if stored not in (unsigned, signed):
        raise ShardFormatError(
            f"shard {shard!r}: corrupt tar header at byte {offset} (checksum mismatch); "
            "the object is damaged: re-upload it"
        )


def split_key(name: str) -> tuple[str, str] | None:
    """``"a/b.seg.png"`` -> ``("a/b", "seg.png")``; None when the name has no key (webdataset's
    ``base_plus_ext``: at least one character before the first dot of the last component)."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot <= slash + 1:
        return None
    return name[:dot], name[dot + 1 :]


# --------------------------------------------------------------------------- writing
def member_bytes(name: str, data_len: int, *, mtime: int = 0) -> bytes:
    """The header block(s) of one regular member (GNU format: long names become an ``L``
    member). The caller writes ``data`` and then ``padding(data_len)`` zero bytes."""
    info = tarfile.TarInfo(name)
    info.size = data_len
    info.mtime = mtime
    info.mode = 0o644
    info.uname = info.gname = ""
    return info.tobuf(format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape")


def padding(n: int) -> int:
    """Zero bytes after ``n`` bytes of member data, up to the next 512-byte block."""
    return -n % BLOCK


def sample_bytes(key: str, fields: dict[str, bytes], *, mtime: int = 0) -> list[bytes]:
    """The tar pieces (headers, data, padding) of one sample, members in ``fields`` order."""
    parts: list[bytes] = []
    for ext, data in fields.items():
        parts.append(member_bytes(f"{key}.{ext}", len(data), mtime=mtime))
        parts.append(data)
        pad = padding(len(data))
        if pad:
            parts.append(_ZERO_BLOCK[:pad])
    return parts


# --------------------------------------------------------------------------- reading
class _Cursor:
    """Sequential reads over a stream of chunks (any buffers), copying only what is kept.

    ``take(n)`` returns a zero-copy memoryview when the n bytes lie in one chunk (the common
    case with MiB-sized chunks and KiB-sized headers) and a joined ``bytes`` otherwise.
    """

    __slots__ = ("_chunks", "_mv", "_pos", "_end", "_base", "shard")

    def __init__(self, chunks: Iterable[Any], shard: str) -> None:
        self._chunks = iter(chunks)
        self._mv = memoryview(b"")
        self._pos = 0
        self._end = 0
        self._base = 0  # stream offset of the current chunk's first byte
        self.shard = shard

    @property
    def offset(self) -> int:
        return self._base + self._pos

    def _advance(self) -> bool:
        for chunk in self._chunks:
            mv = memoryview(chunk).cast("B")
            if len(mv):
                self._base += self._end
                self._mv, self._pos, self._end = mv, 0, len(mv)
                return True
        return False

    def _truncated(self, wanted: int, what: str) -> ShardFormatError:
        return ShardFormatError(
            f"shard {self.shard!r} is truncated: it ends at byte {self.offset} while {what} "
            f"needed {wanted} more bytes; re-upload the shard (or rebuild the manifest if the "
            "object is as intended)"
        )

    def take(self, n: int, what: str) -> memoryview | bytes:
        pos = self._pos
        if pos + n <= self._end:
            self._pos = pos + n
            return self._mv[pos : pos + n]
        parts = [self._mv[pos:]]
        got = self._end - pos
        self._pos = self._end
        while got < n:
            if not self._advance():
                raise self._truncated(n - got, what)
            k = min(n - got, self._end)
            parts.append(self._mv[:k])
            self._pos = k
            got += k
        return b"".join(parts)

    def read(self, n: int, what: str) -> bytes:
        pos = self._pos
        if pos + n <= self._end:
            self._pos = pos + n
            return self._mv[pos : pos + n].tobytes()
        return bytes(self.take(n, what))

    def skip(self, n: int, what: str) -> None:
        while True:
            room = self._end - self._pos
            if n <= room:
                self._pos += n
                return
            n -= room
            self._pos = self._end
            if not self._advance():
                raise self._truncated(n, what)

    def at_eof(self) -> bool:
        return self._pos >= self._end and not self._advance()


def _octal(field: bytes, shard: str, offset: int, what: str) -> int:
    if field and field[0] & 0x80:  # GNU base-256 for values that do not fit in octal
        return int.from_bytes(field[1:], "big") if field[0] == 0x80 else -1
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ShardFormatError(
            f"shard {shard!r}: corrupt tar header at byte {offset}: {what} field {field!r} is "
            "not an octal number"
        ) from None


def _pax_records(data: bytes, shard: str, offset: int) -> dict[str, str]:
    """``"%d %s=%s\\n"`` records (POSIX.1-2001 pax extended header)."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise ShardFormatError(
                f"shard {shard!r}: corrupt pax header at byte {offset}: bad record length"
            ) from None
        record = data[space + 1 : pos + length - 1]  # drop the trailing newline
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


def iter_samples(
    chunks: Iterable[Any],
    shard: str,
    *,
    skip: int = 0,
    stop: int | None = None,
    drain: bool = True,
    counts: list[int] | None = None,
    locate: bool = False,
) -> Iterator[dict[str, Any]]:
    """Samples (``{"__key__": key, ext: bytes, ...}``) of one shard streamed as ``chunks``.

    Yields the samples with index in ``[skip, stop)``; the ones before ``skip`` are passed over
    without copying their data. After ``stop``: with ``drain`` the rest of the archive is
    parsed (not copied) so that ``counts[0]`` can report the shard's sample count; without it
    the generator returns at once and the rest of the stream is never read.
    ``counts[0]`` is set to the number of samples in the shard once its end is reached.
    Raises :class:`ShardFormatError` naming ``shard`` on a truncated or corrupt archive.

    With ``locate`` a member's value is ``(offset, size)`` of its data in the stream instead of
    the bytes (nothing is copied): what the cache's per-shard index (:mod:`.shardindex`)
    records, so that an indexed read yields exactly the samples this parser would.
    """
    if stop is None:
        stop = 1 << 62
    cur = _Cursor(chunks, shard)
    sample: dict[str, Any] | None = None
    key: str | None = None
    index = -1  # index in the shard of the sample being assembled
    long_name: str | None = None
    pax: dict[str, str] = {}
    zero = _ZERO_BLOCK
    while True:
        offset = cur.offset
        hdr = cur.take(BLOCK, "a tar header")
        if hdr[0] == 0 and hdr == zero:
            break  # end of archive (tar readers stop at the first zero block)
        raw = bytes(hdr)
        try:  # fast path: the usual "0001234\0 " / "00000001750\0" fields
            stored = int(raw[148:154], 8)
            size = int(raw[124:135], 8)
        except ValueError:
            stored = _octal(raw[148:156], shard, offset, "checksum")
            size = _octal(raw[124:136], shard, offset, "size")
        if ((adler32(raw) & 0xFFFF) - 1 - sum(raw[148:156]) + _CHKSUM_SPACES - stored) % _ADLER_MOD:
            _check_exactly(raw, stored, shard, offset)
        typ = raw[156]
        if size < 0:
            raise ShardFormatError(f"shard {shard!r}: negative member size at byte {offset}")
        if typ in (0x4C, 0x78, 0x67):  # 'L' GNU long name, 'x' pax header, 'g' global pax
            data = cur.read(size, "a long-name/pax member")
            cur.skip(-size % BLOCK, "member padding")
            if typ == 0x4C:
                long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif typ == 0x78:
                pax = _pax_records(data, shard, offset)
            continue
        if "size" in pax:
            size = int(pax["size"])
        if long_name is not None:
            name = long_name
        elif "path" in pax:
            name = pax["path"]
        else:
            name_b = raw[:100].split(b"\0", 1)[0]
            if raw[257:263] == b"ustar\x00" and raw[345] != 0:  # POSIX prefix field
                name_b = raw[345:500].split(b"\0", 1)[0] + b"/" + name_b
            name = name_b.decode("utf-8", "surrogateescape")
        long_name = None
        pax = {}
        padded = size + (-size % BLOCK)
        # Only regular files ('0', NUL, '7' contiguous) carry samples; others are passed over.
        # KEY.EXT split as split_key() does, inlined (this loop runs once per member).
        slash = name.rfind("/")
        dot = name.find(".", slash + 1)
        if (
            dot <= slash + 1
            or typ not in (0x30, 0x00, 0x37)
            or (name.startswith("__") and _META.match(name))
        ):
            cur.skip(padded, "member data")
            continue
        k, ext = name[:dot], name[dot + 1 :].lower()
        if k != key:
            if sample is not None:
                yield sample
            key = k
            index += 1
            if index >= stop and not drain:
                return
            sample = {"__key__": k} if skip <= index < stop else None
        if sample is None:  # a sample being skipped
            cur.skip(padded, "member data")
            continue
        if ext in sample:
            raise ShardFormatError(
                f"shard {shard!r}: sample {k!r} has two members with extension {ext!r} "
                f"(second at byte {offset}); keys must be unique within a run of members"
            )
        if locate:
            sample[ext] = (cur.offset, size)
            cur.skip(padded, "member data")
            continue
        sample[ext] = cur.read(size, "member data")
        if padded != size:
            cur.skip(padded - size, "member padding")
    if counts is not None:
        counts[0] = index + 1
    if sample is not None:
        yield sample
