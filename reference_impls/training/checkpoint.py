"""Checkpoints: what they hold (the format), how they are read back and kept (the store).

A run directory holds::

    latest.pt        written at every validation: what a resume needs
    latest.prev.pt   the generation before it, and
    latest.prev2.pt  the one before that: the fallbacks when latest.pt is damaged
    best.pt          written only when the validation loss improved (model selection)
    metrics.jsonl    one JSON row per logged step, validation and event (see metrics.py)
    result.json      the run's summary, written when it ends

Every checkpoint (``best.pt`` is a full checkpoint too) is a dict that
``torch.load(weights_only=True)`` reads, with these keys (declared for
``harness.artifacts`` in ``checkpoint_schema.toml`` next to this file)::

    format          "reference_impls.training/1"
    model           the model's state_dict (float tensors)
    optimizer       the optimizer's state_dict (Adam moments, SGD momentum buffers, ...)
    scheduler       the LR scheduler's state_dict
    epoch           int, the epoch of the last optimizer step (numbered from 0)
    step            int, optimizer steps done so far
    position        {"epoch", "batch"}: where the data loader continues (mid-epoch resume)
    early_stopping  {"best", "best_step", "best_epoch", "checks_without_improvement",
                     "patience", "min_delta"}
    val_loss        float, the validation loss measured at this checkpoint
    stop_reason     None while the run goes on; "early_stopping", "max_epochs" or "max_steps"
                    in the checkpoint that ended it
    rng             {"rank0": {"python", "numpy", "torch", "cuda"}, "rank1": ...}: the RNG
                    states of every rank (each rank draws its own dropout masks)
    world_size      int, ranks of the run that wrote it
    config          TrainConfig.to_dict() of the run
    saved_at        float, Unix time of the write

Writing (:func:`save_checkpoint`, in ``checkpoint_io.py`` with the rest of the durable I/O and
the crash tests' fault hook): the bytes go to a temporary file in the same directory,
which is synced (fdatasync); only then do the names move: ``latest.prev.pt`` becomes
``latest.prev2.pt``, ``latest.pt`` becomes ``latest.prev.pt``, the temporary file becomes
``latest.pt``, and the directory is synced. A crash at any point leaves complete generations
under the names that exist, never a half-written ``latest.pt``; a leftover ``.latest.pt.tmp-*``
file is ignored and removed on resume. The temporary file is the old ``latest.prev2.pt``,
renamed and overwritten in place: reusing its disk blocks is what makes a durable write
about as fast as a plain ``torch.save`` (docs/benchmarks/training.md). ``best.pt`` is
published first, as a hard link to the synced temporary file (a copy where links are not
supported), so that a checkpoint claiming a best value never exists before the ``best.pt``
that holds it; a file that ``best.pt`` also names is never reused.

Reading (:func:`load_checkpoint`): the CRC-32 of every record of the zip container
``torch.save`` writes is checked before unpickling (``torch.load`` itself reads a
bit-flipped tensor without complaint), then the keys. Problems raise
:class:`CheckpointCorruptError` naming the file. :class:`CheckpointStore.find_resume` falls
back from a damaged ``latest.pt`` to the older generations, and refuses a checkpoint written
for a different model config with :class:`CheckpointMismatchError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import os
import secrets
import struct
import time
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from reference_impls.atomic import TMP_MARK as _TMP_MARK
from reference_impls.atomic import fsync_dir as _fsync_dir
from reference_impls.training.checkpoint_io import save_checkpoint

__all__ = [
    "BEST",
    "FORMAT",
    "LATEST",
    "PREVIOUS",
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointStore",
    "ResumePoint",
    "RunDirError",
    "check_model_config",
    "check_run_dir",
    "config_differences",
    "load_checkpoint",
    "save_checkpoint",
    "verify_checkpoint_file",
]

FORMAT = "reference_impls.training/1"
LATEST, BEST = "latest.pt", "best.pt"
PREVIOUS = ("latest.prev.pt", "latest.prev2.pt")  # older generations of latest.pt, newest first

# Top-level keys and their types, checked on every load (the full declaration with shapes and
# dtypes is checkpoint_schema.toml, read by harness.artifacts in the suites).
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "model": dict,
    "optimizer": dict,
    "scheduler": dict,
    "epoch": int,
    "step": int,
    "position": dict,
    "early_stopping": dict,
    "val_loss": float,
    "stop_reason": (str, type(None)),
    "rng": dict,
    "world_size": int,
    "config": dict,
}

_VERIFY_CHUNK = 16 << 20


class CheckpointError(Exception):
    """A checkpoint cannot be used. ``path`` is the file (or the run directory)."""

    def __init__(self, message: str, *, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


class CheckpointCorruptError(CheckpointError):
    """The file is truncated, damaged or not a checkpoint of this format."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"checkpoint {path} is unusable: {problem}", path=path)
        self.problem = problem


class CheckpointMismatchError(CheckpointError):
    """The checkpoint was written for a different model config than the one given."""


class RunDirError(CheckpointError):
    """The run directory cannot hold the run's files: a file, not creatable, not writable."""


# --------------------------------------------------------------------------- reading


def verify_checkpoint_file(path: str | os.PathLike) -> None:
    """Check the zip container of a ``torch.save`` file: complete, and every record's CRC-32.

    Raises :class:`CheckpointCorruptError` naming the file and the damaged record.
    """
    path = Path(path)
    try:
        with open(path, "rb") as file, zipfile.ZipFile(file) as archive:
            records = archive.infolist()
            if not records:
                raise CheckpointCorruptError(path, "a zip archive without records")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                bad = _first_bad_record(archive, records, mapped)
    except zipfile.BadZipFile as exc:
        if "not a zip file" in str(exc):
            problem = (
                f"truncated, or not a torch.save file ({path.stat().st_size} bytes, no zip "
                "end-of-archive record)"
            )
        else:
            problem = f"damaged zip container ({exc})"
        raise CheckpointCorruptError(path, problem) from None
    except (EOFError, OSError, ValueError, struct.error) as exc:
        raise CheckpointCorruptError(path, f"cannot read it: {exc}") from None
    if bad is not None:
        raise CheckpointCorruptError(
            path,
            f"CRC-32 mismatch in record {bad}: its bytes changed after they were written "
            "(disk or copy damage)",
        )


def _first_bad_record(
    archive: zipfile.ZipFile, records: list[zipfile.ZipInfo], mapped: mmap.mmap
) -> str | None:
    """The name of the first record whose CRC-32 does not match, or None."""
    # CRC-32 straight over the mapped page cache: no copy (zipfile's reader copies every
    # chunk, ~40% slower on 100 MB; docs/benchmarks/training.md).
    view = memoryview(mapped)
    try:
        for info in records:
            if info.compress_type != zipfile.ZIP_STORED:  # torch.save stores; be general anyway
                with archive.open(info) as member:  # zipfile checks the CRC at the end
                    try:
                        while member.read(_VERIFY_CHUNK):
                            pass
                    except zipfile.BadZipFile:
                        return info.filename
                continue
            # Local header: 30 bytes, then the name and the extra field, whose lengths are at
            # offsets 26 and 28 (they may differ from the central directory's copy).
            name_len, extra_len = struct.unpack_from("<HH", mapped, info.header_offset + 26)
            start = info.header_offset + 30 + name_len + extra_len
            end = start + info.compress_size
            if end > len(mapped) or zlib.crc32(view[start:end]) != info.CRC:
                return info.filename
        return None
    finally:
        view.release()


def load_checkpoint(
    path: str | os.PathLike, *, verify: bool = True, map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Read and check a checkpoint (see the module docstring for what it holds).

    ``verify``: check the CRC-32 of every record first (one extra pass over the file's bytes,
    usually from the page cache; docs/benchmarks/training.md has the cost).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist", path=path)
    if verify:
        verify_checkpoint_file(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointCorruptError(path, f"torch.load failed: {first}") from None
    problems = _structure_problems(state)
    if problems:
        raise CheckpointCorruptError(path, "not a training checkpoint: " + "; ".join(problems))
    return state


def _structure_problems(state: object) -> list[str]:
    if not isinstance(state, dict):
        return [f"expected a dict, got {type(state).__name__}"]
    if state.get("format") != FORMAT:
        return [f"format is {state.get('format')!r}, expected {FORMAT!r}"]
    problems = []
    for key, kind in _REQUIRED.items():
        if key not in state:
            problems.append(f"missing key {key!r}")
        elif not isinstance(state[key], kind) or isinstance(state[key], bool):
            problems.append(f"{key!r} is a {type(state[key]).__name__}")
    return problems


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """``"key: checkpoint X, this run Y"`` for every dotted key whose value differs."""
    a, b = _flatten(saved), _flatten(current)
    out = []
    for key in sorted(set(a) | set(b)):
        was, now = a.get(key, _ABSENT), b.get(key, _ABSENT)
        if was != now:
            out.append(f"{key}: checkpoint {was!r}, this run {now!r}")
    return out


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


# --------------------------------------------------------------------------- the run directory


def _exists(path: Path) -> bool:
    """``path.exists()``, False where the OS refuses to look (a name over the length limit
    raises ENAMETOOLONG from ``stat``): mkdir then fails with a RunDirError saying why."""
    try:
        return path.exists()
    except OSError:
        return False


def check_run_dir(directory: str | os.PathLike) -> None:
    """Create ``directory`` if needed and prove that files can be created in it.

    Raises :class:`RunDirError` saying what is in the way. A real file is created and removed
    rather than asking ``os.access``: root passes every permission check that a read-only
    mount, an immutable directory or a full disk still refuses.
    """
    if not os.fspath(directory).strip():
        # Path("") is ".": the run's files would land in whatever the working directory is.
        raise RunDirError(
            'run directory is an empty string: give a path ("." for the working directory)',
            path=None,
        )
    path = Path(directory)
    existing = path
    while not _exists(existing) and existing != existing.parent:
        existing = existing.parent
    if _exists(existing) and not existing.is_dir():
        if existing == path:
            raise RunDirError(
                f"run directory {path} is a file, not a directory: give a directory (a missing "
                "one is created)",
                path=path,
            )
        raise RunDirError(
            f"cannot create run directory {path}: {existing} is a file, not a directory",
            path=path,
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunDirError(
            f"cannot create run directory {path}: {exc.strerror or exc} (in {existing}); "
            "choose a directory this user may write",
            path=path,
        ) from None
    probe = path / f".write-check-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise RunDirError(
            f"run directory {path} is not writable ({exc.strerror or exc}); checkpoints, "
            "metrics.jsonl and result.json go there: choose a directory this user may write",
            path=path,
        ) from None
    os.close(fd)
    probe.unlink()


@dataclasses.dataclass
class ResumePoint:
    """The checkpoint a run resumes from, and the newer ones that had to be skipped."""

    path: Path
    state: dict[str, Any]
    skipped: list[CheckpointCorruptError]


class CheckpointStore:
    """``latest.pt`` with two older generations, and ``best.pt``, in one run directory."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    @property
    def latest(self) -> Path:
        return self.directory / LATEST

    @property
    def previous(self) -> list[Path]:
        """``latest.prev.pt``, ``latest.prev2.pt``: the fallbacks, newest first."""
        return [self.directory / name for name in PREVIOUS]

    @property
    def best(self) -> Path:
        return self.directory / BEST

    def save(self, state: Mapping[str, Any], *, best: bool) -> None:
        """Write ``latest.pt``, moving the older ones down a name; also ``best.pt`` when
        ``best``, before ``latest.pt`` moves on."""
        self.directory.mkdir(parents=True, exist_ok=True)
        save_checkpoint(
            {**state, "saved_at": time.time()},
            self.latest,
            previous=self.previous,
            also=[self.best] if best else [],
        )

    def has_checkpoints(self) -> bool:
        return any(p.exists() for p in (self.latest, *self.previous, self.best))

    def temporaries(self) -> list[Path]:
        """Temporary files left by writes that were interrupted (a crash, a kill)."""
        if not self.directory.is_dir():
            return []
        names = tuple(f".{name}{_TMP_MARK}" for name in (LATEST, BEST))
        return sorted(p for p in self.directory.iterdir() if p.name.startswith(names))

    def remove_temporaries(self) -> list[Path]:
        found = self.temporaries()
        for path in found:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return found

    def set_aside(self, path: Path) -> Path:
        """Rename a damaged checkpoint out of the way, keeping it for inspection: it must not
        be resumed from again, nor be moved down to ``latest.prev.pt`` by the next save."""
        n = 0
        target = path.with_name(f"{path.name}.corrupt")
        while target.exists():
            n += 1
            target = path.with_name(f"{path.name}.corrupt.{n}")
        os.replace(path, target)
        _fsync_dir(self.directory)
        return target

    def find_resume(
        self, model_config: Mapping[str, Any] | None = None, *, verify: bool = True
    ) -> ResumePoint | None:
        """The newest usable of ``latest.pt``, ``latest.prev.pt`` and ``latest.prev2.pt``; None
        when none exists.

        A damaged file is skipped (and reported in ``skipped``); if every existing candidate is
        damaged, :class:`CheckpointError` lists them all. ``model_config`` (the ``model``
        section of ``TrainConfig.to_dict()``): a checkpoint written for a different one raises
        :class:`CheckpointMismatchError` instead of being used or skipped.
        """
        skipped: list[CheckpointCorruptError] = []
        for path in (self.latest, *self.previous):
            if not path.exists():
                continue
            try:
                state = load_checkpoint(path, verify=verify)
            except CheckpointCorruptError as exc:
                skipped.append(exc)
                continue
            if model_config is not None:
                check_model_config(state, path, model_config)
            return ResumePoint(path, state, skipped)
        if skipped:
            listed = "\n  ".join(str(e) for e in skipped)
            raise CheckpointError(
                f"no usable checkpoint to resume from in {self.directory}:\n  {listed}\n"
                "Start a fresh run in a new directory, or restore a good copy of one of them.",
                path=self.directory,
            )
        return None


def check_model_config(
    state: Mapping[str, Any], path: Path, model_config: Mapping[str, Any]
) -> None:
    """Raise :class:`CheckpointMismatchError` unless ``state`` was written for ``model_config``."""
    saved = state["config"].get("model", {})
    diffs = config_differences({"model": saved}, {"model": dict(model_config)})
    if diffs:
        raise CheckpointMismatchError(
            f"refusing to load {path}: it was written for a different model config "
            f"({'; '.join(diffs)}). Use the config it was written with, or a new run directory "
            "for the new model.",
            path=path,
        )
