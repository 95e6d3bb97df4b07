"""Replacing a file so that readers see the old content or the new, never half of either.

Every reference implementation that writes a whole file for someone else to read (run logs,
results, server state, trace dumps) goes through :func:`replacing` or its two shorthands: the
content is written to a hidden temporary file in the same directory and renamed over the
target (``os.replace`` is atomic when both names are on one file system, which the same
directory guarantees). A crash or a kill therefore leaves the previous file or the new one,
and a temporary file that is never read under the target's name.

``durable`` says what survives a power loss, and each caller states it:

- ``durable=True``: the temporary file is synced before the rename and the directory after
  it, so once the call returns the new content is on disk (state a run resumes from);
- ``durable=False``: the rename is atomic but nothing is synced: after a power loss the file
  may hold the old content (reports and logs that a rerun rewrites). Much cheaper.

Checkpoints have their own writer (``reference_impls.training.checkpoint``), which keeps
generations and reuses disk blocks; it shares :func:`fsync_dir` with this module.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

__all__ = ["TMP_MARK", "fsync_dir", "replacing", "write_bytes", "write_text"]

TMP_MARK = ".tmp-"
"""Part of every temporary file's name (``.NAME.tmp-PID-XXXXXXXX`` beside the target)."""


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make renames in ``directory`` durable (a rename is a change of the directory)."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(path: Path) -> Path:
    """A fresh hidden name beside ``path`` (unique per process and call: two writers of one
    file never share a temporary file)."""
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")


@contextlib.contextmanager
def replacing(path: str | os.PathLike[str], *, durable: bool) -> Iterator[Path]:
    """Yield a temporary path to write the new content to; on a normal exit it replaces
    ``path`` (synced first when ``durable``), on an exception it is removed and ``path`` is
    left as it was. The parent directory must exist.

    Example::

        with replacing(run_dir / "state.pt", durable=True) as tmp:
            torch.save(state, tmp)
    """
    target = Path(path)
    tmp = temp_path(target)
    try:
        yield tmp
        if durable:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(target.parent)


def write_bytes(path: str | os.PathLike[str], data: bytes, *, durable: bool) -> Path:
    """Replace ``path`` with ``data`` atomically (see :func:`replacing`); returns the path."""
    with replacing(path, durable=durable) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str, *, durable: bool) -> Path:
    """Replace ``path`` with ``text`` (UTF-8) atomically (see :func:`replacing`)."""
    return write_bytes(path, text.encode("utf-8"), durable=durable)
