"""Option callbacks shared by the command groups: paths checked before any work."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click


def writable_json_path(ctx: click.Context, param: click.Parameter, value: Path | None) -> Any:
    """A ``--json PATH`` callback: PATH's folder must exist and be writable, and PATH itself,
    where it exists, a writable file, all checked before any work (exit 2 naming the path,
    not a traceback after minutes of work, which would also read as exit 1)."""
    if value is None:
        return None
    folder = value.parent
    if not folder.is_dir():
        raise click.BadParameter(
            f"{str(value)!r}: folder {str(folder)!r} does not exist; create it first "
            f"(mkdir -p {folder})",
            ctx=ctx,
            param=param,
        )
    if not os.access(folder, os.W_OK):
        raise click.BadParameter(
            f"{str(value)!r}: folder {str(folder)!r} is not writable", ctx=ctx, param=param
        )
    if value.exists() and (value.is_dir() or not os.access(value, os.W_OK)):
        raise click.BadParameter(
            f"{str(value)!r}: " + ("a folder" if value.is_dir() else "not writable"),
            ctx=ctx,
            param=param,
        )
    return value
