"""A node-local hot cache in front of an artifact store: byte-bounded, LRU, with pinning.

Files are kept as ``root/<sha256>``. Room is reserved *before* a download starts (evicting
least-recently-used, unpinned entries), so the bytes on disk never exceed ``max_bytes``
under any access pattern, concurrent fetches included; an artifact that cannot fit (larger
than the bound, or everything else pinned) is downloaded straight to its destination.
Pinned entries (the artifacts active runs use) are never evicted. Every copy out of the
cache is verified against its sha256 (a damaged cache file is dropped and fetched again).

The cache is per process (one lock); on start it adopts files a previous process left,
oldest access first, and deletes partial downloads. Counters: hits, misses, evictions,
bypasses (fetches that did not fit), bytes in use.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference_impls.tracking.artifacts import CHUNK, SHA_RE, _verify_stream, check_sha
from reference_impls.tracking.errors import ArtifactError

__all__ = ["CacheStats", "HotCache"]


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    bypasses: int
    bytes_in_use: int
    max_bytes: int
    entries: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "hit_rate": self.hit_rate}


class HotCache:
    def __init__(self, root: str | os.PathLike[str], max_bytes: int) -> None:
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive number of bytes, got {max_bytes!r}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, int] = OrderedDict()  # sha -> size, LRU first
        self._reserved = 0  # bytes of downloads in flight
        self._pins: Counter[str] = Counter()
        self._reading: Counter[str] = Counter()  # copies out in progress: not evictable
        self.hits = self.misses = self.evictions = self.bypasses = 0
        found = []
        for f in self.root.iterdir():
            if f.name.endswith(".part"):
                f.unlink(missing_ok=True)
            elif SHA_RE.fullmatch(f.name):
                st = f.stat()
                found.append((st.st_atime, f.name, st.st_size))
        for _, sha, size in sorted(found):
            self._entries[sha] = size
        self._evict_to(self.max_bytes)  # a smaller bound than last time

    # ------------------------------------------------------------------ accounting
    @property
    def bytes_in_use(self) -> int:
        return sum(self._entries.values()) + self._reserved

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self.hits,
                self.misses,
                self.evictions,
                self.bypasses,
                self.bytes_in_use,
                self.max_bytes,
                len(self._entries),
            )

    def __contains__(self, sha256: str) -> bool:
        with self._lock:
            return sha256 in self._entries

    def _evict_to(self, limit: int) -> bool:
        """Evict LRU unpinned entries until bytes_in_use <= limit; False if impossible."""
        for sha in list(self._entries):
            if self.bytes_in_use <= limit:
                break
            if self._pins[sha] or self._reading[sha]:
                continue
            size = self._entries.pop(sha)
            (self.root / sha).unlink(missing_ok=True)
            self.evictions += 1
            del size
        return self.bytes_in_use <= limit

    # ------------------------------------------------------------------ pinning
    def pin(self, sha256: str) -> None:
        with self._lock:
            self._pins[check_sha(sha256)] += 1

    def unpin(self, sha256: str) -> None:
        with self._lock:
            if self._pins[sha256] <= 0:
                raise ArtifactError(f"{sha256} is not pinned")
            self._pins[sha256] -= 1
            if not self._pins[sha256]:
                del self._pins[sha256]

    @contextlib.contextmanager
    def pinned(self, hashes: Iterable[str]) -> Iterator[None]:
        hs = list(hashes)
        for h in hs:
            self.pin(h)
        try:
            yield
        finally:
            for h in hs:
                self.unpin(h)

    # ------------------------------------------------------------------ fetching
    def fetch(self, sha256: str, size: int, dest: str | os.PathLike[str], store: Any) -> bool:
        """Put verified bytes of ``sha256`` at ``dest``; True on a cache hit."""
        check_sha(sha256)
        dest = Path(dest)
        with self._lock:
            hit = sha256 in self._entries
            if hit:
                self._entries.move_to_end(sha256)
                self._reading[sha256] += 1
                self.hits += 1
            else:
                self.misses += 1
                fits = size <= self.max_bytes and self._evict_to(self.max_bytes - size)
                if fits:
                    self._reserved += size
                else:
                    self.bypasses += 1
        if hit:
            try:
                self._copy_out(sha256, size, dest)
                return True
            except ArtifactError:
                self._drop(sha256)  # damaged in the cache: fetch it from the store
                return self.fetch(sha256, size, dest, store)
            finally:
                with self._lock:
                    self._reading[sha256] -= 1
                    if not self._reading[sha256]:
                        del self._reading[sha256]
        if not fits:
            store.get_to_file(sha256, dest, size)
            return False
        tmp = self.root / f"{sha256}.{uuid.uuid4().hex[:8]}.part"
        try:
            store.get_to_file(sha256, tmp, size)
            os.replace(tmp, self.root / sha256)
        except BaseException:
            with self._lock:
                self._reserved -= size
            tmp.unlink(missing_ok=True)
            raise
        with self._lock:
            self._reserved -= size
            if sha256 in self._entries:  # a concurrent fetch got there first
                pass
            else:
                self._entries[sha256] = size
            self._reading[sha256] += 1
        try:
            self._copy_out(sha256, size, dest)
        finally:
            with self._lock:
                self._reading[sha256] -= 1
                if not self._reading[sha256]:
                    del self._reading[sha256]
        return False

    def _copy_out(self, sha256: str, size: int, dest: Path) -> None:
        src = self.root / sha256

        def chunks() -> Iterator[bytes]:
            with open(src, "rb", buffering=0) as f:
                while chunk := f.read(CHUNK):
                    yield chunk

        _verify_stream(chunks(), dest, sha256, size, f"cached copy {src}")

    def _drop(self, sha256: str) -> None:
        with self._lock:
            if self._entries.pop(sha256, None) is not None:
                (self.root / sha256).unlink(missing_ok=True)

    def disk_bytes(self) -> int:
        """Bytes of files in the cache directory (what the bound promises about)."""
        return sum(f.stat().st_size for f in self.root.iterdir() if f.is_file())
