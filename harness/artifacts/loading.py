"""Reading artifacts by extension and checking them against a schema (``validate``, ``check``,
``load``)."""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.artifacts._values import _type_name
from harness.artifacts.errors import ArtifactError, Violation
from harness.artifacts.specs import Schema, _Context

SUPPORTED_SUFFIXES = (".pt", ".pth", ".ckpt", ".npz", ".json", ".jsonl")
_TORCH_SUFFIXES = (".pt", ".pth", ".ckpt")


# --------------------------------------------------------------------------------------------
# Validation


@dataclass(frozen=True)
class _Rows:
    """The rows of a metrics log: ``(line number, row)``."""

    items: list[tuple[int, object]]


def validate(obj_or_path: object, schema: Schema, *, allow_pickle: bool = False) -> list[Violation]:
    """Every way ``obj_or_path`` differs from ``schema``; empty when it matches.

    ``obj_or_path`` is a loaded artifact (a dict), a list of rows (a metrics log), or a path
    read with :func:`load` (``.jsonl`` lines that are not JSON objects are violations). Raises
    :class:`ArtifactError` when a file cannot be read at all.
    """
    _, violations = _load_and_validate(obj_or_path, schema, allow_pickle)
    return violations


def check(obj_or_path: object, schema: Schema, *, allow_pickle: bool = False) -> object:
    """Like :func:`validate`, but raise :class:`ArtifactError` listing every violation.

    Returns the artifact (for a path, what :func:`load` returns), so a loader can read and
    check in one step: ``state = check(path, CHECKPOINT)``.
    """
    obj, violations = _load_and_validate(obj_or_path, schema, allow_pickle)
    if violations:
        path = Path(obj_or_path) if isinstance(obj_or_path, (str, os.PathLike)) else None
        what = str(obj_or_path) if path is not None else "artifact"
        raise ArtifactError(
            f"{what} does not match schema {schema.name!r} ({len(violations)} "
            f"violation{'s' if len(violations) != 1 else ''}):\n{_listed(violations)}",
            path=path,
            violations=violations,
        )
    return obj


def _load_and_validate(
    obj_or_path: object, schema: Schema, allow_pickle: bool
) -> tuple[object, list[Violation]]:
    if not isinstance(schema, Schema):
        raise TypeError(f"schema must be a harness.artifacts.Schema, got {_type_name(schema)}")
    violations: list[Violation] = []
    obj = obj_or_path
    if isinstance(obj_or_path, (str, os.PathLike)):
        path = Path(obj_or_path)
        if path.suffix.lower() == ".jsonl":
            rows, violations = _read_jsonl(path)
            obj = _Rows(rows)
        else:
            obj = load(path, allow_pickle=allow_pickle)
    elif isinstance(obj_or_path, list):
        obj = _Rows(list(enumerate(obj_or_path, start=1)))

    if isinstance(obj, _Rows):
        for number, row in obj.items:
            ctx = _Context(line=number)  # symbolic dims bind per row
            schema._validate(row, ctx)
            violations.extend(ctx.violations)
        if not obj.items and not violations:
            violations.append(Violation("", "no rows", "missing"))
        violations.sort(key=lambda v: v.line or 0)  # stable: a row's violations keep their order
        return [row for _, row in obj.items], violations
    ctx = _Context()
    schema._validate(obj, ctx)
    return obj, ctx.violations


# --------------------------------------------------------------------------------------------
# Loading


def load(path: str | os.PathLike[str], *, allow_pickle: bool = False) -> object:
    """Read an artifact by its extension (see the module docstring).

    ``.jsonl`` gives the list of rows. Raises :class:`ArtifactError` naming the file and what
    failed for a missing, unsupported, truncated or corrupt file.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise ArtifactError(
            f"{path}: unsupported file type {suffix or '(none)'!r}; "
            f"supported: {' '.join(SUPPORTED_SUFFIXES)}",
            path=path,
        )
    if not path.is_file():
        raise ArtifactError(f"{path}: no such file", path=path)
    if suffix in _TORCH_SUFFIXES:
        return _load_torch(path, allow_pickle)
    if suffix == ".npz":
        return _load_npz(path, allow_pickle)
    if suffix == ".json":
        try:
            return json.loads(_read_text(path))
        except RecursionError:
            raise _fail(path, _TOO_DEEP) from None
        except json.JSONDecodeError as exc:
            raise ArtifactError(
                f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                path=path,
            ) from None
    rows, bad = _read_jsonl(path)
    if bad:
        raise ArtifactError(
            f"{path}: not a JSON-lines file:\n{_listed(bad)}", path=path, violations=bad
        )
    return [row for _, row in rows]


_TOO_DEEP = (
    f"nested too deeply to read (Python's recursion limit, about {sys.getrecursionlimit()} "
    "levels of arrays or objects); no artifact of this harness nests like that"
)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise _fail(path, f"cannot read: {exc.strerror or exc}") from None


def _read_jsonl(path: Path) -> tuple[list[tuple[int, object]], list[Violation]]:
    rows: list[tuple[int, object]] = []
    bad: list[Violation] = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except RecursionError:
            bad.append(Violation("", _TOO_DEEP, "parse", number))
            continue
        except json.JSONDecodeError as exc:
            # Typically the last line of a log whose writer was killed mid-write.
            message = f"not valid JSON: {exc.msg} (column {exc.colno})"
            bad.append(Violation("", message, "parse", number))
            continue
        if not isinstance(row, dict):
            message = f"expected a JSON object, got {_type_name(row)}"
            bad.append(Violation("", message, "parse", number))
            continue
        rows.append((number, row))
    return rows, bad


def _load_torch(path: Path, allow_pickle: bool) -> object:
    try:
        import torch  # noqa: PLC0415 - slow; only needed for checkpoints
    except ImportError:
        raise _fail(path, f"reading {path.suffix} files needs torch: pip install torch") from None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        # torch words it "Unsupported global: GLOBAL mod.name was not an allowed global" or
        # "Trying to load unsupported GLOBAL mod.name whose module mod is blocked".
        unsafe = re.search(r"GLOBAL ([\w.]+)", str(exc))
        if unsafe is None:
            raise _fail(path, f"not a readable torch checkpoint: {_reason(exc, path)}") from None
        if not allow_pickle:
            raise ArtifactError(
                f"{path}: torch.load(weights_only=True) refused the global {unsafe.group(1)} it "
                "holds, which only full unpickling can rebuild, and unpickling runs whatever code "
                "the file names. If you trust the file, pass allow_pickle=True "
                "(harness artifacts validate --allow-pickle).",
                path=path,
            ) from None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # e.g. the class it names cannot be imported here
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _fail(path, f"full unpickling (allow_pickle=True) failed: {first}") from None


def _load_npz(path: Path, allow_pickle: bool) -> dict[str, object]:
    import numpy as np  # noqa: PLC0415

    with path.open("rb") as f:
        magic = f.read(4)
    if magic not in (b"PK\x03\x04", b"PK\x05\x06"):  # zip local header / empty-archive record
        raise ArtifactError(f"{path}: not an .npz archive (not a zip file)", path=path)
    key = None
    try:
        with np.load(path, allow_pickle=allow_pickle) as archive:
            out = {}
            for key in archive.files:
                array = archive[key]
                out[key] = array[()] if array.ndim == 0 else array
            return out
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise ArtifactError(
                f"{path}: array {key!r} holds Python objects, which only unpickling can rebuild "
                "(it can run arbitrary code). If you trust the file, pass allow_pickle=True.",
                path=path,
            ) from None
        raise _fail(path, f"not a readable .npz archive: {_reason(exc, path)}") from None
    except Exception as exc:
        where = f" (array {key!r})" if key is not None else ""
        raise ArtifactError(
            f"{path}: not a readable .npz archive{where}: {_reason(exc, path)}", path=path
        ) from None


def _listed(violations: list[Violation]) -> str:
    return "\n".join(f"  {v}" for v in violations)


def _fail(path: Path, problem: str) -> ArtifactError:
    return ArtifactError(f"{path}: {problem}", path=path)


def _reason(exc: BaseException, path: Path) -> str:
    """The first sentence of the error, and the file's size: torch's messages run to paragraphs
    and an empty or cut-off file is the usual cause."""
    text = str(exc)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = line.split(". ", 1)[0].rstrip(".")
    if not line:
        line = "unexpected end of file" if isinstance(exc, EOFError) else type(exc).__name__
    if len(line) > 200:
        line = line[:197] + "..."
    return f"{line} (file of {path.stat().st_size} bytes; truncated or corrupt?)"
