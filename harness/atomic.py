"""Writing a file so that readers see the old content or the new, never half of either.

Every file the harness writes for someone else to read (reports, the quarantine, goldens) goes
through :func:`write_text`: the text is written to a temporary file in the same directory,
flushed to disk, and renamed over the target (``os.replace`` is atomic on POSIX and Windows
when both names are on one file system, which the same directory guarantees). A crash, a
Ctrl-C or a full disk therefore leaves the previous file intact, and a report reader never
parses a file that is still being written.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["TEMP_SUFFIX", "write_text"]

TEMP_SUFFIX = ".tmp"
"""Suffix of the temporary files (``.NAME.XXXX.tmp`` beside the target): a process killed
between writing and renaming leaves one behind, hidden, and never under the target's name."""


def write_text(path: os.PathLike[str] | str, text: str) -> Path:
    """Replace ``path`` with ``text`` (UTF-8, ``\\n`` newlines) atomically; returns the path.

    The parent directory must exist. An existing file keeps its permission bits; a new one
    gets the usual ``0o666 & ~umask``. On any failure the temporary file is removed and the
    old file, if any, is left as it was.
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    temp: Path | None = None
    try:
        with tempfile.NamedTemporaryFile(
            "w",
            encoding="utf-8",
            newline="\n",
            dir=path.parent,
            prefix=f".{path.name}.",
            suffix=TEMP_SUFFIX,
            delete=False,
        ) as handle:
            temp = Path(handle.name)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        if temp is not None:
            temp.unlink(missing_ok=True)
        raise
    return path
