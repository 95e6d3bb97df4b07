"""A local disk cache of whole shards (the node's NVMe cache), shared by the processes of a node.

Files: ``<sha256>-<crc32>.tar``, named by content (the manifest's sha256), so a shard whose
object changed never hits a stale copy, and identical shards share one file. A shard enters
the cache only after its bytes were verified against the manifest's sha256 while streaming:
it is written to ``<sha256>.<size>.<pid>.<random>.part`` as it downloads and renamed into
place (atomic) once complete and verified. The CRC32 of those bytes is recorded in the name,
so each later read re-verifies the file at CRC speed (~6 GB/s here, vs ~1.9 GB/s for SHA-256;
``verify="sha256"`` checks the full hash instead) *before* any sample of it is yielded: a
damaged cached file is deleted and the shard fetched again from the source.

Size limit: ``max_bytes`` bounds the finished files plus the reserved (final) size of the ones
being written. Room for a new shard is made by evicting least-recently-used files (a hit
touches the file's mtime). The processes of a node coordinate through the file system only:

* a reader holds a shared ``flock`` on the file it reads; eviction takes an exclusive
  non-blocking ``flock`` first and skips a file it cannot lock, so a shard being read (by any
  process on the node) is never evicted;
* reservations and evictions run under an exclusive ``flock`` on ``<dir>/.lock``, so two
  processes cannot both spend the last free bytes;
* only names matching the patterns above are ever deleted, and the cache refuses a directory
  inside a local dataset, so eviction can never delete source data.

When even eviction cannot make room (everything pinned, or a shard larger than the cache),
the shard is streamed without being cached (``cache_skipped``) rather than exceed the limit.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import re
import secrets
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .manifest import ShardInfo
from .metrics import Metrics

__all__ = ["CachedShard", "CacheWriter", "ShardCache"]

_DONE = re.compile(r"^([0-9a-f]{64})-([0-9a-f]{8})\.tar$")
_PART = re.compile(r"^([0-9a-f]{64})\.(\d+)\.(\d+)\.([0-9a-f]+)\.part$")
_VERIFY = ("crc32", "sha256", "size")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _map(fd: int) -> mmap.mmap:
    """Read-only map of the whole file. MAP_POPULATE maps every page up front in one call (the
    kernel batches it, in this fetch thread, without the GIL) instead of taking one page
    fault per 4 KiB later, in whichever thread touches it first."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)


class CachedShard:
    """A verified cached shard, pinned (shared flock) and mapped until :meth:`close`."""

    def __init__(self, path: Path, fd: int, mm: mmap.mmap) -> None:
        self.path = path
        self._fd = fd
        self._mm = mm
        self.view = memoryview(mm)

    def close(self) -> None:
        if self._fd < 0:
            return
        self.view.release()
        try:
            self._mm.close()
        except BufferError:
            # A sample still references the map (cannot happen with bytes samples); the map
            # is closed when the last reference goes. The pin is released either way.
            pass
        os.close(self._fd)  # releases the shared flock
        self._fd = -1


class CacheWriter:
    """A shard being written into the cache while it streams."""

    def __init__(self, cache: ShardCache, shard: ShardInfo, part: Path) -> None:
        self._cache = cache
        self.shard = shard
        self.part = part
        self._f = open(part, "wb")  # noqa: SIM115 - closed in commit/abort; buffered: writes whole
        self._crc = 0
        self.written = 0

    def write(self, data: bytes | memoryview) -> None:
        self._f.write(data)
        self._crc = zlib.crc32(data, self._crc)
        self.written += len(data)

    def commit(self) -> Path | None:
        """Rename into place; the caller has checked the sha256. None if the size is off."""
        self._f.close()
        if self.written != self.shard.size:
            self.part.unlink(missing_ok=True)
            return None
        final = self._cache.directory / f"{self.shard.sha256}-{self._crc:08x}.tar"
        os.replace(self.part, final)
        return final

    def abort(self) -> None:
        if not self._f.closed:
            self._f.close()
        self.part.unlink(missing_ok=True)


class ShardCache:
    """Whole-shard cache in ``directory`` holding at most ``max_bytes``."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int, *,
                 verify: str = "crc32", protected: Iterable[str | os.PathLike[str]] = (),
                 metrics: Metrics | None = None) -> None:
        if max_bytes <= 0:
            raise ValueError(f"cache max_bytes must be > 0, got {max_bytes}")
        if verify not in _VERIFY:
            raise ValueError(f"cache verify must be one of {_VERIFY}, got {verify!r}")
        self.directory = Path(directory).resolve()
        for root in protected:
            root = Path(root).resolve()
            if self.directory == root or root in self.directory.parents:
                raise ValueError(
                    f"cache directory {self.directory} lies inside the dataset directory {root}; "
                    "eviction must never touch source data: choose a directory outside it"
                )
        self.max_bytes = max_bytes
        self.verify = verify
        self.metrics = metrics if metrics is not None else Metrics()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.directory / ".lock"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["metrics"] = None  # each process counts its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.metrics = Metrics()

    # ----------------------------------------------------------------------- inspection
    def entries(self) -> list[tuple[Path, int, float]]:
        """Finished files: (path, size, mtime), oldest first."""
        out = []
        for e in os.scandir(self.directory):
            if _DONE.match(e.name):
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat()
                    out.append((Path(e.path), st.st_size, st.st_mtime))
        out.sort(key=lambda t: t[2])
        return out

    def used_bytes(self) -> int:
        """Finished files plus the full size reserved by files being written."""
        used = 0
        for e in os.scandir(self.directory):
            if _DONE.match(e.name):
                with contextlib.suppress(FileNotFoundError):
                    used += e.stat().st_size
            elif m := _PART.match(e.name):
                used += int(m.group(2))
        return used

    def path_for(self, shard: ShardInfo) -> Path | None:
        prefix = shard.sha256 + "-"
        for e in os.scandir(self.directory):
            if e.name.startswith(prefix) and _DONE.match(e.name):
                return Path(e.path)
        return None

    # ----------------------------------------------------------------------- reading
    def lookup(self, shard: ShardInfo) -> CachedShard | None:
        """The verified cached copy, pinned; None on a miss or a corrupt copy (deleted)."""
        path = self.path_for(shard)
        if path is None:
            self.metrics.add(cache_misses=1)
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # evicted between the scan and the open
            self.metrics.add(cache_misses=1)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # pin: eviction skips files it cannot lock
            size = os.fstat(fd).st_size
            ok = size == shard.size
            mm = _map(fd) if ok and size else None
            if ok and mm is not None and self.verify != "size":
                ok = self._verify(mm, shard, path)
        except BaseException:
            os.close(fd)
            raise
        if not ok:
            if mm is not None:
                mm.close()
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self.metrics.add(cache_corrupt=1, cache_misses=1)
            return None
        with contextlib.suppress(FileNotFoundError):  # evicted meanwhile: our map stays valid
            os.utime(path)  # LRU: a hit makes the file the most recently used
        self.metrics.add(cache_hits=1)
        return CachedShard(path, fd, mm)  # type: ignore[arg-type]

    def _verify(self, mm: mmap.mmap, shard: ShardInfo, path: Path) -> bool:
        # Both release the GIL on large buffers, so a prefetch thread verifies the next shard
        # while the consumer parses this one.
        if self.verify == "sha256":
            return hashlib.sha256(mm).hexdigest() == shard.sha256
        m = _DONE.match(path.name)
        return m is not None and f"{zlib.crc32(mm):08x}" == m.group(2)

    # ----------------------------------------------------------------------- writing
    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def reserve(self, shard: ShardInfo) -> CacheWriter | None:
        """Room for ``shard`` (evicting LRU unpinned files as needed) and a writer for it;
        None when it cannot fit under the limit."""
        if shard.size > self.max_bytes:
            self.metrics.add(cache_skipped=1)
            return None
        with self._locked():
            self._remove_stale_parts()
            used = self.used_bytes()
            if used + shard.size > self.max_bytes:
                used -= self._evict(used + shard.size - self.max_bytes)
            if used + shard.size > self.max_bytes:
                self.metrics.add(cache_skipped=1)
                return None
            part = self.directory / (
                f"{shard.sha256}.{shard.size}.{os.getpid()}.{secrets.token_hex(4)}.part")
            writer = CacheWriter(self, shard, part)  # creates the file: counted from now on
        return writer

    def _evict(self, need: int) -> int:
        freed = 0
        for path, size, _ in self.entries():
            if freed >= need:
                break
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # pinned: some process is reading it
                path.unlink(missing_ok=True)
                freed += size
                self.metrics.add(cache_evictions=1)
            finally:
                os.close(fd)
        return freed

    def _remove_stale_parts(self) -> None:
        """Parts left by a process that died mid-write would hold their reservation forever."""
        for e in os.scandir(self.directory):
            m = _PART.match(e.name)
            if m and not _pid_alive(int(m.group(3))):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)

    def clear(self) -> None:
        """Delete every finished file (pinned ones too: their readers keep their open copy)."""
        for path, _, _ in self.entries():
            path.unlink(missing_ok=True)

