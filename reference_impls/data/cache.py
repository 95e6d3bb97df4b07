"""A local disk cache of whole shards (the node's NVMe cache), shared by the processes of a node.

Files: ``<sha256>-<crc32>.tar``, named by content (the manifest's sha256), so a shard whose
object changed never hits a stale copy, and identical shards share one file. A shard enters
the cache only after its bytes were verified against the manifest's sha256 while streaming:
it is written to ``<sha256>.<size>.<pid>.<random>.part`` as it downloads and renamed into
place (atomic) once complete and verified. The CRC32 of those bytes is recorded in the name,
so each later read re-verifies the file at CRC speed (~5.5 GB/s here, vs ~1.9 GB/s for
SHA-256; ``verify="sha256"`` checks the full hash instead) *before* any sample of it is
yielded: a damaged cached file is deleted and the shard fetched again from the source. The
check runs on the fetch thread (reading the file in 1 MiB pieces; CRC32 and SHA-256 release
the GIL), so the shards fetched ahead are checked while the current one is consumed.

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

Index: beside each ``<sha256>-<crc32>.tar`` a ``<sha256>-<crc32>.idx`` lists every sample's
key and its members' data ranges (:mod:`.shardindex`), so that a hit reads each member with
one ``pread`` instead of parsing tar headers again. It is built by scanning the file's
headers once, when the shard enters the cache, and written atomically (a
``<sha256>-<crc32>.idx.<pid>.<random>.part`` renamed into place) under the cache lock, counted
in ``max_bytes`` like the files (room for it is made by eviction too; without room the
index is not written). A hit checks the tar first (``verify``), then reads the index; a
missing, truncated, corrupt or stale index is rebuilt from the verified tar
(``cache_index_rebuilds``). An index is deleted with its tar (eviction, a failed check,
:meth:`ShardCache.clear`); one left without its tar, and parts of dead processes, are removed
by the next reservation.
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

from .errors import ShardFormatError
from .manifest import ShardInfo
from .metrics import Metrics
from .shardindex import ShardIndex

__all__ = ["CachedShard", "CacheWriter", "ShardCache"]

_DONE = re.compile(r"^([0-9a-f]{64})-([0-9a-f]{8})\.tar$")
_PART = re.compile(r"^([0-9a-f]{64})\.(\d+)\.(\d+)\.([0-9a-f]+)\.part$")
_IDX = re.compile(r"^([0-9a-f]{64})-([0-9a-f]{8})\.idx$")
_IDX_PART = re.compile(r"^([0-9a-f]{64})-([0-9a-f]{8})\.idx\.(\d+)\.([0-9a-f]+)\.part$")
_VERIFY = ("crc32", "sha256", "size")
_VERIFY_CHUNK = 1 << 20


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _map(fd: int) -> mmap.mmap:
    """Read-only map of the whole file (to scan or parse it). MAP_POPULATE maps every page up
    front in one call (the kernel batches it, without the GIL) instead of taking one page
    fault per 4 KiB later, in whichever thread touches it first."""
    populate = getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | populate, prot=mmap.PROT_READ)


def _read_pieces(fd: int, start: int, stop: int, consume: Any) -> bool:
    """Feed bytes ``[start, stop)`` of ``fd`` to ``consume`` in pieces; False if the file is
    shorter."""
    buf = memoryview(bytearray(_VERIFY_CHUNK))
    try:
        offset = start
        while offset < stop:
            n = os.preadv(fd, [buf[: min(_VERIFY_CHUNK, stop - offset)]], offset)
            if n <= 0:
                return False
            with buf[:n] as piece:
                consume(piece)
            offset += n
        return True
    finally:
        buf.release()


def _crc_range(fd: int, start: int, stop: int) -> int | None:
    """CRC32 of bytes ``[start, stop)`` of ``fd``; None if the file is shorter."""
    crc = 0

    def update(piece: memoryview) -> None:
        nonlocal crc
        crc = zlib.crc32(piece, crc)

    return crc if _read_pieces(fd, start, stop, update) else None


def index_path(tar: Path) -> Path:
    """Where the index of the cached file ``tar`` lives."""
    return tar.with_suffix(".idx")


class CachedShard:
    """A verified cached shard, pinned (shared flock) and open until :meth:`close`.

    ``index`` is its sample index: read samples with ``os.pread(fd, ...)`` at its offsets
    (:meth:`.shardindex.ShardIndex.read`). It is None only when the tar cannot be indexed (it
    does not parse): then read ``view``, a map of the whole file, with the parser, which
    reports what is wrong. ``view`` is mapped on first use either way.
    """

    def __init__(
        self, path: Path, fd: int, index: ShardIndex | None, mm: mmap.mmap | None = None
    ) -> None:
        self.path = path
        self.fd = fd
        self.index = index
        self._mm = mm
        self._view: memoryview | None = None

    @property
    def view(self) -> memoryview:
        if self._view is None:
            if self._mm is None:
                self._mm = _map(self.fd) if os.fstat(self.fd).st_size else None
            self._view = memoryview(self._mm if self._mm is not None else b"")
        return self._view

    def close(self) -> None:
        if self.fd < 0:
            return
        if self._view is not None:
            self._view.release()
        if self._mm is not None:
            # A parser's view may still reference the map; it is unmapped when the last
            # reference goes. The pin is released either way.
            with contextlib.suppress(BufferError):
                self._mm.close()
        os.close(self.fd)  # releases the shared flock
        self.fd = -1


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
        self._cache.index_new_file(final, self.shard, self._crc)
        return final

    def abort(self) -> None:
        if not self._f.closed:
            self._f.close()
        self.part.unlink(missing_ok=True)


class ShardCache:
    """Whole-shard cache in ``directory`` holding at most ``max_bytes``."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int,
        *,
        verify: str = "crc32",
        protected: Iterable[str | os.PathLike[str]] = (),
        metrics: Metrics | None = None,
    ) -> None:
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
        """Finished files and their indexes plus the full size reserved by files being
        written (and the indexes being written)."""
        used = 0
        for e in os.scandir(self.directory):
            if _DONE.match(e.name) or _IDX.match(e.name) or _IDX_PART.match(e.name):
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
        """The verified cached copy, pinned, with its sample index; None on a miss or a
        corrupt copy (deleted)."""
        path = self.path_for(shard)
        if path is None:
            self.metrics.add(cache_misses=1)
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # evicted between the scan and the open
            self.metrics.add(cache_misses=1)
            return None
        mm = None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # pin: eviction skips files it cannot lock
            size = os.fstat(fd).st_size
            ok = size == shard.size
            if ok and size and self.verify != "size":
                ok = self._verify(fd, size, shard, path)
            index = None
            if ok:
                index, mm = self._index(path, fd, shard)
        except BaseException:
            if mm is not None:
                mm.close()
            os.close(fd)
            raise
        if not ok:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            with contextlib.suppress(FileNotFoundError):
                index_path(path).unlink()
            self.metrics.add(cache_corrupt=1, cache_misses=1)
            return None
        with contextlib.suppress(FileNotFoundError):  # evicted meanwhile: our fd stays valid
            os.utime(path)  # LRU: a hit makes the file the most recently used
        self.metrics.add(cache_hits=1)
        return CachedShard(path, fd, index, mm)

    def _verify(self, fd: int, size: int, shard: ShardInfo, path: Path) -> bool:
        """Check the file's bytes against the CRC32 in its name (or the manifest's sha256).

        Read in 1 MiB pieces (nothing is mapped: in a VM, setting up the page tables of a
        64 MB map costs about as much as reading it); CRC32 and SHA-256 release the GIL, so
        the fetch thread checks the next shard while the consumer reads this one. The kernel
        is told first that the whole file will be read (``POSIX_FADV_WILLNEED``): when the
        file is on the disk rather than in the page cache, it is read ahead while the check
        computes, instead of one 1 MiB piece at a time between computations.
        """
        with contextlib.suppress(OSError, AttributeError):  # a hint: not every OS has it
            os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
        if self.verify == "sha256":
            sha = hashlib.sha256()
            ok = _read_pieces(fd, 0, size, sha.update)
            return ok and sha.hexdigest() == shard.sha256
        m = _DONE.match(path.name)
        if m is None:
            return False
        crc = _crc_range(fd, 0, size)
        return crc is not None and f"{crc:08x}" == m.group(2)

    # ----------------------------------------------------------------------- index
    def load_index(self, path: Path, shard: ShardInfo) -> ShardIndex | None:
        """The intact index of the cached file ``path``, or None (missing or not valid)."""
        m = _DONE.match(path.name)
        if m is None:
            return None
        try:
            data = index_path(path).read_bytes()
        except OSError:  # missing (or unreadable): rebuilt from the tar
            return None
        return ShardIndex.decode(
            data, size=shard.size, crc=int(m.group(2), 16), sha256=shard.sha256
        )

    def _index(
        self, path: Path, fd: int, shard: ShardInfo
    ) -> tuple[ShardIndex | None, mmap.mmap | None]:
        """The index of a verified hit: read from its file, else rebuilt from the tar (and
        written for the next hit). When the tar cannot be indexed (it does not parse), no
        index and the map the reader parses instead, so that it reports what is wrong."""
        index = self.load_index(path, shard)
        if index is not None or shard.size == 0:
            return index, None
        self.metrics.add(cache_index_rebuilds=1)
        mm = _map(fd)
        try:
            index = ShardIndex.scan(mm, path.name)
        except ShardFormatError:
            return None, mm
        except BaseException:
            mm.close()
            raise
        mm.close()
        m = _DONE.match(path.name)
        if m is not None:
            self.write_index(path, shard, int(m.group(2), 16), index)
        return index, None

    def index_new_file(self, path: Path, shard: ShardInfo, crc: int) -> None:
        """Index a file just renamed into the cache (its bytes matched the sha256)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # evicted already: no index is needed
            return
        try:
            if shard.size == 0:
                return
            mm = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            try:
                index = ShardIndex.scan(mm, path.name)
            except ShardFormatError:
                return  # the reader parses it and reports the error
            finally:
                mm.close()
        finally:
            os.close(fd)
        self.write_index(path, shard, crc, index)

    def write_index(self, path: Path, shard: ShardInfo, crc: int, index: ShardIndex) -> bool:
        """Write the index of cached file ``path`` atomically, within ``max_bytes`` (evicting
        other unpinned files if needed); False when it was not written."""
        data = index.encode(size=shard.size, crc=crc, sha256=shard.sha256)
        if data is None:
            return False
        final = index_path(path)
        with self._locked():
            if not path.exists():  # evicted or deleted meanwhile: no orphan index
                return False
            try:
                old = final.stat().st_size
            except FileNotFoundError:
                old = 0
            used = self.used_bytes()
            need = used - old + len(data) - self.max_bytes
            if need > 0 and self._evict(need, keep=path) < need:
                return False
            tmp = self.directory / f"{final.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, final)
            except BaseException as exc:
                tmp.unlink(missing_ok=True)
                if isinstance(exc, OSError):  # e.g. a full disk: hits rebuild it in memory
                    return False
                raise
        return True

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
                f"{shard.sha256}.{shard.size}.{os.getpid()}.{secrets.token_hex(4)}.part"
            )
            writer = CacheWriter(self, shard, part)  # creates the file: counted from now on
        return writer

    def _evict(self, need: int, keep: Path | None = None) -> int:
        """Delete least-recently-used unpinned files (and their indexes) until ``need`` bytes
        are freed; returns the bytes freed."""
        freed = 0
        for path, size, _ in self.entries():
            if freed >= need:
                break
            if path == keep:
                continue
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
                idx = index_path(path)
                with contextlib.suppress(FileNotFoundError):
                    idx_size = idx.stat().st_size
                    idx.unlink()
                    freed += idx_size
                self.metrics.add(cache_evictions=1)
            finally:
                os.close(fd)
        return freed

    def _remove_stale_parts(self) -> None:
        """Parts left by a process that died mid-write would hold their reservation forever;
        an index whose file is gone (a crash between the two deletions) is removed too."""
        names = {e.name: e.path for e in os.scandir(self.directory)}
        for name, path in names.items():
            if m := _PART.match(name) or _IDX_PART.match(name):  # group 3: the writer's pid
                stale = not _pid_alive(int(m.group(3)))
            else:
                stale = bool(_IDX.match(name)) and name[:-4] + ".tar" not in names
            if stale:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def clear(self) -> None:
        """Delete every finished file and index (pinned ones too: their readers keep their
        open copy)."""
        for path, _, _ in self.entries():
            path.unlink(missing_ok=True)
        for e in os.scandir(self.directory):  # the indexes, also any left without their tar
            if _IDX.match(e.name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)
