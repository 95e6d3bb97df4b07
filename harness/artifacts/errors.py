"""What validation reports: malformed schemas, violations, unreadable or invalid artifacts."""

from __future__ import annotations

from collections import abc
from dataclasses import dataclass
from pathlib import Path


class SchemaError(ValueError):
    """A schema is malformed: a bad spec, an unknown key in a schema file, a bad import path."""


@dataclass(frozen=True)
class Violation:
    """One way an artifact differs from its schema.

    ``path`` is the dotted key path (``model.layer1.weight``; empty for the artifact itself),
    ``kind`` one of ``missing``, ``unexpected``, ``type``, ``shape``, ``dtype``, ``non_finite``,
    ``value``, ``parse``; ``line`` is the 1-based row of a metrics log, else None.
    """

    path: str
    message: str
    kind: str
    line: int | None = None

    def __str__(self) -> str:
        where = ": ".join(p for p in (f"line {self.line}" if self.line else "", self.path) if p)
        return f"{where or '(top level)'}: {self.message}"


class ArtifactError(Exception):
    """An artifact cannot be read, or does not match its schema (``violations`` says how)."""

    def __init__(
        self, message: str, *, path: Path | None = None, violations: abc.Iterable[Violation] = ()
    ) -> None:
        super().__init__(message)
        self.path = path
        self.violations = list(violations)
