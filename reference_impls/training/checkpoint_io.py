"""Durable I/O of checkpoints: writing a ``torch.save`` file so that a crash at any moment
leaves complete generations under the names that exist.

:func:`save_checkpoint` (the format and the store are in ``checkpoint.py``): the bytes go to
a temporary file in the same directory, which is synced (fdatasync); only then do the names
move: the older generations one name down, the temporary file to ``path``; then the
directory is synced. The temporary file is the oldest generation's file, renamed and
overwritten in place (reusing its disk blocks is what makes a durable write about as fast as
a plain ``torch.save``, docs/benchmarks/training.md).

Crash tests stop a write at each of its steps through one hook, :func:`set_fault_hook`,
instead of replacing functions of this module.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import shutil
import stat
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from reference_impls.atomic import fsync_dir as _fsync_dir
from reference_impls.atomic import temp_path as _tmp_path

__all__ = ["FAULT_POINTS", "save_checkpoint", "set_fault_hook"]

# Write in pieces of this size and ask the kernel to start writing each piece back to disk
# right away (Linux sync_file_range), so the fsync at the end waits for the last piece only
# instead of the whole file: serialization and disk writes overlap (docs/benchmarks/training.md).
_WRITEBACK_BYTES = 8 << 20
# torch.save writes many small records (headers, the pickle); gather them into one syscall.
_DEFAULT_SMALL_WRITE = 64 << 10
_SMALL_WRITE = _DEFAULT_SMALL_WRITE
_PAGE = mmap.PAGESIZE


# --------------------------------------------------------------------------- fault injection

FAULT_POINTS = ("start", "chunk", "synced", "published", "rotated", "renamed")
"""Where a write calls the fault hook, in order: ``start`` (nothing written yet), ``chunk``
(after each write to the temporary file: a partial file), ``synced`` (the temporary file
complete and synced, no name changed), ``published`` (after each ``also`` path such as
``best.pt`` is in place), ``rotated`` (the older generations moved down, the new file not
yet under ``path``'s name), ``renamed`` (the new file under ``path``'s name, the directory not
yet synced)."""

FaultHook = Callable[[str, Path], None]
_fault_hook: FaultHook | None = None


def set_fault_hook(hook: FaultHook | None, *, gather_bytes: int | None = None) -> None:
    """Install ``hook(point, path)``, called at each of :data:`FAULT_POINTS` of every write
    (``path``: the checkpoint being written), or remove it with None. For crash tests: the
    hook may kill the process, or raise to simulate a failing disk.

    ``gather_bytes``: gather small writes only up to this many bytes (default 64 KiB), so
    that even a small checkpoint is written in many pieces, each a ``chunk`` point.
    """
    global _fault_hook, _SMALL_WRITE
    _fault_hook = hook
    _SMALL_WRITE = gather_bytes if gather_bytes is not None else _DEFAULT_SMALL_WRITE


def _fault(point: str, path: Path) -> None:
    if _fault_hook is not None:
        _fault_hook(point, path)


# --------------------------------------------------------------------------- writing


def _load_sync_file_range():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writeback of dirty pages, do not wait
_fdatasync = getattr(os, "fdatasync", os.fsync)  # the data and the size; not the mtime


class _DurableWriter:
    """The file object ``torch.save`` writes into.

    Small writes (headers, the pickle) are gathered; large ones (tensor data) go straight to
    the file. Every write to the file starts and ends on a page boundary (except the last):
    rewriting part of a page of a reused file that is no longer cached would make the kernel
    read the page from disk first. Writeback is started every ``_WRITEBACK_BYTES`` (a hint;
    ignored where unsupported).
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self._path = path  # the checkpoint being written (for the fault hook)
        self._pending = bytearray()  # starts at a page boundary of the file
        self._written = 0
        self._writeback_from = 0
        self._writeback = _sync_file_range is not None
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        try:
            if len(self._pending) + size < _SMALL_WRITE:
                self._pending += view
                return size
            if self._pending:  # complete the pending bytes' last page, write whole pages
                head = min(size, -len(self._pending) % _PAGE)
                self._pending += view[:head]
                view = view[head:]
                whole = len(self._pending) - len(self._pending) % _PAGE
                self._write_all(memoryview(self._pending)[:whole])
                self._pending = self._pending[whole:]
            if not self._pending:  # on a page boundary: whole pages straight from the caller
                body = len(view) - len(view) % _PAGE
                self._write_all(view[:body])
                view = view[body:]
            self._pending += view
        except OSError as exc:
            # torch.save replaces it with "unexpected pos ..." when it closes the archive;
            # keep it so the caller can raise what really happened (a full disk, ...).
            self.error = exc
            raise
        return size

    def flush(self) -> None:
        if self._pending:
            self._write_all(memoryview(self._pending))
            self._pending = bytearray()

    @property
    def size(self) -> int:
        return self._written + len(self._pending)

    def _write_all(self, view: memoryview) -> None:
        while len(view):
            n = os.write(self._fd, view[:_WRITEBACK_BYTES])
            view = view[n:]
            self._written += n
            _fault("chunk", self._path)
            if self._writeback and self._written - self._writeback_from >= _WRITEBACK_BYTES:
                length = self._written - self._writeback_from
                if _sync_file_range(self._fd, self._writeback_from, length, _SYNC_FILE_RANGE_WRITE):
                    self._writeback = False  # e.g. a filesystem without it: fsync does it all
                self._writeback_from = self._written


@contextlib.contextmanager
def _crc32_on() -> Iterator[None]:
    # load_checkpoint verifies the zip records' CRC-32s; torch.save writes zeros when the
    # process turned them off (torch.serialization.set_crc32_options(False)).
    get = getattr(torch.serialization, "get_crc32_options", None)
    if get is None or get():
        yield
        return
    torch.serialization.set_crc32_options(True)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(False)


def _recyclable(path: Path) -> bool:
    """Whether ``path``'s file may be rewritten in place: it exists and no other name
    (``best.pt`` is a hard link to some generation) refers to it."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_nlink == 1


def _write_temp(state: Mapping[str, Any], path: Path, *, reuse: Path | None) -> Path:
    """Serialize ``state`` into a synced temporary file next to ``path``; return its path.

    ``reuse``: an expendable file (the oldest generation) to rename to the temporary name and
    overwrite in place. Rewriting its blocks is cheaper than writing a new file and freeing
    the old one, which ext4 does inside the rename that drops its last name (~20 ms per
    100 MB on the project's CPU machine, docs/benchmarks/training.md).
    """
    tmp = _tmp_path(path)
    if reuse is not None:
        os.replace(reuse, tmp)
        fd = os.open(tmp, os.O_WRONLY)
    else:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    writer = _DurableWriter(fd, path)
    try:
        with _crc32_on():
            torch.save(state, writer)  # type: ignore[arg-type]  # file-like: write()
        writer.flush()
        if reuse is not None:
            os.ftruncate(fd, writer.size)  # the old file may have been longer
        _fdatasync(fd)
        _fault("synced", path)
    except BaseException as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if writer.error is not None and exc is not writer.error:
            raise writer.error from exc
        raise
    os.close(fd)
    return tmp


def _publish_copy(tmp: Path, dest: Path) -> None:
    """Make ``dest`` hold the same bytes as the synced ``tmp``, atomically."""
    staged = _tmp_path(dest)
    try:
        # Same inode, no second write. _recyclable never reuses a file with two names, so
        # dest's bytes are never rewritten while it names them.
        os.link(tmp, staged)
    except OSError:
        shutil.copyfile(tmp, staged)
        fd = os.open(staged, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    try:
        os.replace(staged, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        raise


def save_checkpoint(
    state: Mapping[str, Any],
    path: str | os.PathLike,
    *,
    previous: Sequence[str | os.PathLike] = (),
    also: Sequence[str | os.PathLike] = (),
) -> None:
    """Write ``state`` to ``path`` atomically and durably.

    ``previous``: names of the older generations, newest first (``latest.prev.pt``,
    ``latest.prev2.pt``). The existing ``path`` and generations each move one name down and
    the oldest generation's file is reused for the new bytes. ``also``: paths that get the
    same checkpoint, published before ``path`` moves on (``best.pt``). Until the new bytes
    are synced no existing name changes; after, ``path`` or the next name holds a complete
    generation at every moment.
    """
    if isinstance(previous, (str, os.PathLike)):
        raise TypeError(
            f"previous is a sequence of paths, newest first; got the single path {previous!r}"
        )
    path = Path(path)
    chain = [path, *(Path(p) for p in previous)]
    # Reuse the oldest generation's file only while every newer name holds one: after a
    # fallback it may be the only good checkpoint left, and must stay until the new one is in.
    full = len(chain) > 1 and all(p.exists() for p in chain[:-1])
    oldest = chain[-1] if full and _recyclable(chain[-1]) else None
    _fault("start", path)
    tmp = _write_temp(state, path, reuse=oldest)
    try:
        for other in also:
            _publish_copy(tmp, Path(other))
            _fault("published", path)
        # prev -> prev2, latest -> prev (chain[1:] is one shorter: the oldest moves nowhere)
        for newer, older in reversed(list(zip(chain, chain[1:], strict=False))):
            if newer.exists():
                os.replace(newer, older)
        _fault("rotated", path)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fault("renamed", path)
    _fsync_dir(path.parent)
