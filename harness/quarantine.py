"""The flaky-test quarantine: reading, validating and editing ``quarantine.toml``.

Quarantine, not retries (docs/harness.md). A quarantined test still runs on every CI run; its
failures are reported but do not fail the gate. Every entry says why (``reason``), where the fix
is tracked (``issue``), when it was quarantined (``added``) and until when (``expires``)::

    [[quarantine]]
    test = "suites/unit/test_x.py::test_y"
    reason = "fails about 1 in 50 on the GPU runner"
    issue = "https://github.com/ORG/REPO/issues/123"
    added = 2026-11-30
    expires = 2026-12-31

A quarantine lasts at most ``MAX_DAYS`` days from ``added``: it is a holding pattern while
someone fixes the test, not a place where tests go to be forgotten. An expired entry fails the
gate (the pytest plugin's job); renewing one is an explicit, reviewed edit with a new ``added``.

This module knows nothing of pytest or click: the plugin (``harness.plugin``) and the CLI
(``harness.cli.quarantine``) are thin layers over ``load``, ``find``, ``add`` and ``remove``.
Every problem with the file is a ``QuarantineError`` whose message reads
``PATH:LINE: what is wrong; how to fix it``, so editors and CI logs link straight to the line.

Over 500 lines, one concern: one file format, read with line-numbered errors, checked, and
edited in place (``add``/``remove`` rewrite its text block by block with the reader's line
bookkeeping).
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import difflib
import itertools
import os
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import tomlkit

from harness import atomic

__all__ = [
    "DEFAULT_DAYS",
    "DEFAULT_HEADER",
    "FILENAME",
    "KEYS",
    "MAX_DAYS",
    "Entry",
    "QuarantineError",
    "add",
    "existence_problem",
    "find",
    "load",
    "node_id_problem",
    "problems",
    "remove",
]

FILENAME = "quarantine.toml"
# A month covers "flaky since the last release, owner is on it"; a quarter (MAX_DAYS) is the
# longest horizon on which a fix is still a plan rather than a hope. Beyond it the test should be
# fixed, deleted, or renewed in a reviewed change that says why it is still flaky.
DEFAULT_DAYS = 30
MAX_DAYS = 90
# The keys of one entry, in the order they are written.
KEYS = ("test", "reason", "issue", "added", "expires")

DEFAULT_HEADER = """\
# Flaky-test quarantine, reviewed like code. Edit it with `harness quarantine add/remove`,
# read it with `harness quarantine list`.
#
# A quarantined test still runs on every CI run: its failures are reported, but they do not
# fail the gate. Nothing is ever retried into green: the flake hunter (`harness flaky`)
# runs a test again under the same and under new seeds to find out why it flakes.
#
# Each entry is one [[quarantine]] table with exactly these keys:
#   test     pytest node id, as pytest prints it; without "[param]" it covers every
#            parametrization of the test
#   reason   how it fails and how often
#   issue    http(s) link to the issue that tracks the fix
#   added    the day it was quarantined, a TOML date (no quotes)
#   expires  the last day it is quarantined: at most 90 days after added
# for example
#   [[quarantine]]
#   test = "suites/unit/test_x.py::test_y"
#   reason = "fails about 1 in 50 on the GPU runner"
#   issue = "https://github.com/ORG/REPO/issues/123"
#   added = 2026-11-30
#   expires = 2026-12-31
#
# From the day after `expires` the entry fails the gate, and so does an entry whose test no
# longer exists: fix the test and remove the entry, or renew it (new added and expires dates)
# in a reviewed change whose reason says why it is still flaky.
"""

# tomllib (Python < 3.14) gives the position only inside the message.
_TOML_POSITION = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)\s*$")
_QUARANTINE_HEADER = re.compile(
    r"""^\s*\[\[\s*(?:quarantine|"quarantine"|'quarantine')\s*\]\]\s*(?:#.*)?$"""
)
_ANY_TABLE_HEADER = re.compile(r"^\s*\[")
# A pytest node id: a relative path to a .py file, then ::-separated Python names (a class, a
# test function), then optionally one "[param]" suffix.
_NODE_ID = re.compile(r"[^\s:\[\]\\]+\.py(?:::[^\W\d]\w*)+(?:\[.*\])?")
# Characters no node id holds and no terminal shows faithfully (C0 controls, DEL, C1 controls).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NODE_ID_EXAMPLE = "suites/unit/test_x.py::test_y"
_ISSUE_EXAMPLE = "https://github.com/ORG/REPO/issues/123"


class QuarantineError(ValueError):
    """A malformed quarantine file or a refused edit.

    The message is ``PATH:LINE: what is wrong; how to fix it`` (``PATH: ...`` when the problem
    is not on a line of the file, e.g. removing a test that has no entry).
    """

    def __init__(self, path: os.PathLike[str] | str, line: int, problem: str) -> None:
        self.path = Path(path)
        self.line = line
        self.problem = problem
        where = f"{path}:{line}" if line else f"{path}"
        super().__init__(f"{where}: {problem}")

    def __reduce__(self) -> tuple[type[QuarantineError], tuple[Path, int, str]]:
        return (type(self), (self.path, self.line, self.problem))


@dataclasses.dataclass(frozen=True)
class Entry:
    """One quarantined test. Constructing one validates it (``ValueError`` when invalid)."""

    test: str
    """A pytest node id; without "[param]" it covers every parametrization of the test."""
    reason: str
    """How the test fails and how often; never empty."""
    issue: str
    """http(s) URL of the issue that tracks the fix."""
    added: datetime.date
    """The day the test was quarantined (or the entry last renewed)."""
    expires: datetime.date
    """The last day the quarantine holds; at most MAX_DAYS after ``added``."""
    line: int = 0
    """1-based line of the entry's [[quarantine]] header in its file; 0 if not from a file."""

    def __post_init__(self) -> None:
        problem = _first_problem(dataclasses.asdict(self))
        if problem is not None:
            raise ValueError(problem[1])

    def matches(self, nodeid: str) -> bool:
        """True for the entry's own node id and, when it names no parametrization, for each of
        its parametrizations (``test[...]``)."""
        if nodeid == self.test:
            return True
        return "[" not in self.test and nodeid.startswith(self.test + "[") and nodeid.endswith("]")

    def is_expired(self, today: datetime.date) -> bool:
        """True from the day after ``expires`` on: the entry holds through its expiry date."""
        return self.expires < today

    def days_left(self, today: datetime.date) -> int:
        """Days until the quarantine lapses: 0 on the expiry day itself, negative after it."""
        return (self.expires - today).days


def load(path: os.PathLike[str] | str) -> list[Entry]:
    """Read and validate a quarantine file; a missing or empty file is an empty quarantine.

    Raises ``QuarantineError`` (``PATH:LINE: ...``) for the first problem found.
    """
    path = Path(path)
    text = _read_text(path)
    return _parse(path, text) if text is not None else []


def find(entries: Iterable[Entry], nodeid: str) -> Entry | None:
    """The entry that quarantines ``nodeid``: an exact entry wins over one covering all
    parametrizations; None when the test is not quarantined."""
    entries = list(entries)
    for entry in entries:
        if entry.test == nodeid:
            return entry
    for entry in entries:
        if entry.matches(nodeid):
            return entry
    return None


def add(
    path: os.PathLike[str] | str,
    test: str,
    *,
    reason: str,
    issue: str,
    today: datetime.date | None = None,
    expires: datetime.date | None = None,
    days: int = DEFAULT_DAYS,
    root: os.PathLike[str] | str | None = None,
) -> Entry:
    """Quarantine ``test`` from ``today`` until ``expires`` (default: ``today + days``).

    With ``root`` (the project directory; the CLI passes the quarantine file's directory) the
    test must also exist there: its file inside ``root`` and the named function or class in
    that file (:func:`existence_problem`). Without it only the node id's form is checked.

    The file is validated first and never edited when malformed; entries stay sorted by test
    id; comments, including the header, are kept. Creates the file (with ``DEFAULT_HEADER``)
    when it does not exist or is blank. Returns the new entry, with its line in the rewritten file.
    """
    path = Path(path)
    text = _read_text(path)
    entries = _parse(path, text) if text is not None else []
    today = today or datetime.date.today()

    if expires is None:
        if not 1 <= days <= MAX_DAYS:
            raise QuarantineError(
                path,
                0,
                f"days must be between 1 and {MAX_DAYS}, got {days}; a quarantine is "
                f"short-term (MAX_DAYS = {MAX_DAYS}): fix the test instead of parking it longer",
            )
        expires = today + datetime.timedelta(days=days)
    elif expires < today:
        raise QuarantineError(
            path,
            0,
            f"expires ({expires}) is in the past (today is {today}); give a date "
            f"from today to {today + datetime.timedelta(days=MAX_DAYS)}",
        )

    values = {"test": test, "reason": reason, "issue": issue, "added": today, "expires": expires}
    problem = _first_problem(values)
    if problem is not None:
        raise QuarantineError(path, 0, problem[1])
    for entry in entries:
        if entry.test == test:
            raise QuarantineError(
                path,
                entry.line,
                f"{test!r} is already quarantined (until {entry.expires}); "
                "edit that entry in a reviewed change, or remove it first",
            )
        if entry.matches(test):
            raise QuarantineError(
                path,
                entry.line,
                f"{test!r} is already quarantined by {entry.test!r}, which "
                "covers every parametrization; nothing to add",
            )

    if root is not None:
        missing = existence_problem(Path(root), test)
        if missing is not None:
            raise QuarantineError(
                path,
                0,
                f"cannot quarantine {test!r}: {missing}; quarantine a test that exists, by "
                "its node id as `pytest --collect-only -q` prints it from the project root",
            )

    # A new or blank file gets the header that explains the format and the policy.
    base = text if text is not None and text.strip() else DEFAULT_HEADER
    new_text = _insert_block(base, _render(values))
    written = _write_validated(path, new_text)
    found = find(written, test)
    assert found is not None  # the file was just written with it and validated
    return found


def remove(path: os.PathLike[str] | str, test: str) -> Entry:
    """Delete the entry for exactly ``test`` and return it; other lines are kept as they are.

    An unknown test is a ``QuarantineError`` that names the closest entries.
    """
    path = Path(path)
    text = _read_text(path)
    entries = _parse(path, text) if text is not None else []
    target = next((entry for entry in entries if entry.test == test), None)
    if target is None:
        raise QuarantineError(path, 0, _not_found(test, entries, exists=text is not None))
    assert text is not None  # an entry was found in it

    lines = text.split("\n")
    preamble, blocks = _split_blocks(lines)
    kept = [block for block, entry in zip(blocks, entries, strict=True) if entry is not target]
    _write_validated(path, _join(preamble, kept))
    return target


# ---------------------------------------------------------------------------------------------
# Parsing and validation


def _read_text(path: Path) -> str | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise QuarantineError(
            path, 0, "is a directory, not a quarantine file; name the quarantine.toml file itself"
        ) from None
    except (OSError, ValueError) as error:  # ValueError: a NUL byte in the path
        why = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise QuarantineError(path, 0, f"cannot read the quarantine file: {why}") from None
    return _decode(path, raw)


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise QuarantineError(
            path,
            line,
            f"not UTF-8 (byte {raw[error.start]:#04x}); TOML files are UTF-8: "
            "re-save the file as UTF-8",
        ) from None


def _parse(path: Path, text: str) -> list[Entry]:
    lines = text.split("\n")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        position = _TOML_POSITION.search(message)
        what = message[: position.start()] if position else message
        if position and position.group(1):
            line, where = int(position.group(1)), f" at column {position.group(2)}"
        else:
            line, where = max(1, len(text.rstrip("\n").split("\n"))), " at the end of the file"
        raise QuarantineError(
            path, line, f"TOML syntax error{where}: {what}; fix the syntax (https://toml.io)"
        ) from None

    for key in data:
        if key != "quarantine":
            raise QuarantineError(
                path,
                _top_level_line(lines, key),
                f"unknown top-level key {key!r}; the file "
                "holds only [[quarantine]] entries: remove it or move it into an entry",
            )
    if "quarantine" not in data:
        return []

    headers = [number for number, line in enumerate(lines) if _QUARANTINE_HEADER.match(line)]
    raw_entries = data["quarantine"]
    if (
        not isinstance(raw_entries, list)
        or not raw_entries
        or not all(isinstance(item, dict) for item in raw_entries)
        or len(headers) != len(raw_entries)
    ):
        raise QuarantineError(
            path,
            _top_level_line(lines, "quarantine"),
            "quarantine must be written as "
            "[[quarantine]] tables (double brackets), one per entry, not as "
            f"{_toml_type(raw_entries)}; put a [[quarantine]] line above each entry's keys",
        )

    entries: list[Entry] = []
    seen: dict[str, int] = {}
    for index, (header, raw) in enumerate(zip(headers, raw_entries, strict=True)):
        header_line = header + 1
        end = _block_end(lines, header)

        def key_line(key: str, header: int = header, end: int = end) -> int:
            return _key_line(lines, key, header + 1, end) or header + 1

        for key in raw:
            if key not in KEYS:
                close = difflib.get_close_matches(key, KEYS, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise QuarantineError(
                    path,
                    key_line(key),
                    f"unknown key {key!r} in quarantine entry "
                    f"{index + 1}; {hint}the keys are {', '.join(KEYS)}",
                )
        missing = [key for key in KEYS if key not in raw]
        if missing:
            raise QuarantineError(
                path,
                header_line,
                f"quarantine entry {index + 1} is missing "
                f"{', '.join(map(repr, missing))}; every entry needs {', '.join(KEYS)}",
            )
        problem = _first_problem(raw)
        if problem is not None:
            key, message = problem
            raise QuarantineError(path, key_line(key), message)

        test = raw["test"]
        if test in seen:
            raise QuarantineError(
                path,
                header_line,
                f"{test!r} is quarantined twice (lines {seen[test]} and "
                f"{header_line}); keep one entry",
            )
        seen[test] = header_line
        entries.append(Entry(**raw, line=header_line))
    return entries


def _first_problem(values: dict[str, Any]) -> tuple[str, str] | None:
    """The first (key, message) wrong with one entry's values, or None when they are valid."""
    for key in ("test", "reason", "issue"):
        value = values[key]
        if not isinstance(value, str):
            return key, (
                f'{key} must be a string, got {_toml_type(value)} {value!r}; write {key} = "..."'
            )
    for key in ("added", "expires"):
        value = values[key]
        problem = _date_problem(key, value)
        if problem is not None:
            return key, problem

    test, reason, issue = values["test"], values["reason"], values["issue"]
    id_problem = node_id_problem(test)
    if id_problem is not None:
        return "test", id_problem
    if not reason.strip():
        return "reason", (
            "reason is empty; say how the test fails and how often, e.g. "
            "'fails about 1 in 50 on the GPU runner'"
        )
    url = urlsplit(issue)
    if url.scheme not in ("http", "https") or not url.netloc or any(c.isspace() for c in issue):
        return "issue", (
            f"issue must be the http(s) URL of the issue tracking the fix, got "
            f"{issue!r}; e.g. {_ISSUE_EXAMPLE}"
        )

    added, expires = values["added"], values["expires"]
    if expires < added:
        return "expires", (
            f"expires ({expires}) is before added ({added}); set expires to a "
            f"date from {added} to {added + datetime.timedelta(days=MAX_DAYS)}"
        )
    length = (expires - added).days
    if length > MAX_DAYS:
        return "expires", (
            f"expires ({expires}) is {length} days after added ({added}); a quarantine lasts "
            f"at most {MAX_DAYS} days: fix the test, or renew the entry with added = today "
            "and a reason that says why it is still flaky"
        )
    return None


def node_id_problem(test: str) -> str | None:
    """None when ``test`` has the form of a pytest node id of a file inside the project, else
    what is wrong with it (naming the value and the fix).

    The form is ``relative/path.py::[Class::]function[param]``. Refused, because the id is
    handed to pytest and joined to the project directory: a leading ``-`` (pytest would read
    an option, such as ``--junitxml=../x``), an absolute path, ``.`` or ``..`` path parts,
    empty parts (``a//b.py``), backslashes, whitespace in the path, and control characters
    anywhere (a trailing newline included). This is the form only: :func:`existence_problem` checks
    that the test exists.
    """
    fix = (
        f"give a pytest node id like {_NODE_ID_EXAMPLE!r}, as `pytest --collect-only -q` prints "
        "it from the project root"
    )
    control = _CONTROL.search(test)
    if control is not None:
        return (
            f"test {test!r} contains the control character {control.group()!r} at index "
            f"{control.start()}; {fix}"
        )
    if test.startswith("-"):
        return f"test {test!r} starts with '-', which pytest would read as an option; {fix}"
    if not _NODE_ID.fullmatch(test):
        return f"test must be a pytest node id like {_NODE_ID_EXAMPLE!r}, got {test!r}; {fix}"
    file_part = test.split("::", 1)[0]
    if file_part.startswith("/"):
        return f"test {test!r} is an absolute path; node ids are relative to the project root"
    bad = [part for part in file_part.split("/") if part in ("", ".", "..")]
    if bad:
        return (
            f"test {test!r} has the path part {bad[0]!r}; node ids name a file inside the "
            f"project with plain folder names, e.g. {_NODE_ID_EXAMPLE!r}"
        )
    return None


def problems(entries: list[Entry], root: Path, path: Path, today: datetime.date) -> list[str]:
    """What makes the quarantine file at ``path`` fail a run: entries that expired before
    ``today``, and entries whose test no longer exists under ``root`` (stale). Each names the
    entry's line and the fix."""
    found = []
    for entry in entries:
        where = f"{path.name}:{entry.line}"
        if entry.is_expired(today):
            found.append(
                f"{where}: quarantine of {entry.test} expired on {entry.expires} "
                f"({entry.issue}); fix the test, or extend the entry with a reason"
            )
        missing = existence_problem(root, entry.test)
        if missing:
            found.append(
                f"{where}: stale quarantine entry {entry.test}: {missing}; remove it "
                f"(harness quarantine remove '{entry.test}')"
            )
    return found


def existence_problem(root: Path, test: str) -> str | None:
    """None when the node id ``test`` names a test present under ``root``, else why not.

    The file must be inside ``root`` once symlinks are resolved, and every name after ``::``
    (a class, then a function; a ``[param]`` suffix is not checked) must be defined in it.
    Checked on the source (AST) rather than by collecting, so it is fast, imports nothing,
    and finds a test whatever ``--tier`` or ``-k`` selection a run makes. A file that does not
    parse counts as present: collecting it reports the syntax error itself.
    """
    problem = node_id_problem(test)
    if problem is not None:
        return problem
    file_part, *names = test.split("::")
    root = Path(root).resolve()
    path = (root / file_part).resolve()
    if not path.is_relative_to(root):
        return f"file {file_part} resolves to {path}, outside the project {root}"
    if not path.is_file():
        return f"file {file_part} does not exist"
    if not names:
        return None
    names[-1] = names[-1].split("[", 1)[0]
    try:
        body: list[ast.stmt] = ast.parse(path.read_bytes(), str(path)).body
    except (SyntaxError, ValueError):
        return None
    except OSError as error:
        return f"file {file_part} cannot be read ({error.strerror or error})"
    for name in names:
        found = [
            node
            for node in body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and node.name == name
        ]
        if not found:
            return f"no test {'::'.join(names)} in {file_part}"
        body = found[0].body if isinstance(found[0], ast.ClassDef) else []
    return None


def _date_problem(key: str, value: object) -> str | None:
    # datetime.datetime is a subclass of datetime.date: test it first.
    if isinstance(value, datetime.datetime):
        return (
            f"{key} must be a date, got the date-time {value.isoformat()}; "
            f"write {key} = {value.date().isoformat()}"
        )
    if isinstance(value, datetime.date):
        return None
    if isinstance(value, str):
        try:
            example = datetime.date.fromisoformat(value.strip()).isoformat()
        except ValueError:
            example = "2026-12-31"
        return (
            f"{key} must be a TOML date, got the string {value!r}; "
            f"write {key} = {example} without quotes"
        )
    return (
        f"{key} must be a TOML date, got {_toml_type(value)} {value!r}; "
        f"write {key} = 2026-12-31 without quotes"
    )


def _toml_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an inline array"
    if isinstance(value, dict):
        return "a single table"
    if isinstance(value, datetime.time):
        return "a time"
    return type(value).__name__


def _key_pattern(key: str) -> re.Pattern[str]:
    name = re.escape(key)
    return re.compile(rf"""^\s*(?:{name}|"{name}"|'{name}')\s*[=.]""")


def _key_line(lines: list[str], key: str, start: int, end: int) -> int | None:
    """1-based line of ``key = ...`` within lines[start:end], or None."""
    pattern = _key_pattern(key)
    for number in range(start, end):
        if pattern.match(lines[number]):
            return number + 1
    return None


def _top_level_line(lines: list[str], key: str) -> int:
    """1-based line where a top-level key is defined: ``key = ...`` before the first table
    header, or a ``[key...]``/``[[key...]]`` header; 1 when it cannot be found."""
    first_table = next(
        (n for n, line in enumerate(lines) if _ANY_TABLE_HEADER.match(line)), len(lines)
    )
    found = _key_line(lines, key, 0, first_table)
    if found:
        return found
    name = re.escape(key)
    header = re.compile(rf"""^\s*\[\[?\s*(?:{name}|"{name}"|'{name}')\s*[\].]""")
    for number, line in enumerate(lines):
        if header.match(line):
            return number + 1
    return 1


def _block_end(lines: list[str], header: int) -> int:
    """Index of the first line after the table that starts at ``header``."""
    for number in range(header + 1, len(lines)):
        if _ANY_TABLE_HEADER.match(lines[number]):
            return number
    return len(lines)


def _not_found(test: str, entries: list[Entry], *, exists: bool) -> str:
    if not exists:
        return f"no entry for {test!r}: the file does not exist"
    covering = find(entries, test)
    if covering is not None:
        return (
            f"no entry for exactly {test!r}; it is quarantined by {covering.test!r} "
            f"(line {covering.line}), which covers every parametrization: remove that"
        )
    if not entries:
        return f"no entry for {test!r}: the quarantine is empty"
    # Node ids share long path prefixes: difflib's default cutoff (0.6) would suggest
    # unrelated tests from the same folder.
    close = difflib.get_close_matches(test, [entry.test for entry in entries], n=3, cutoff=0.8)
    if close:
        return f"no entry for {test!r}; did you mean {' or '.join(map(repr, close))}?"
    return (
        f"no entry for {test!r} among {len(entries)} entries; `harness quarantine list` shows them"
    )


# ---------------------------------------------------------------------------------------------
# Editing. The file is edited as text, block by block, so everything a reviewer wrote (the
# header, comments on an entry) survives; tomlkit only renders the new values.
#
# A block is one [[quarantine]] table plus the comment lines directly above its header (no
# blank line between): those comments travel with the entry when the entries are re-sorted.
# Everything before the first block (the header comment) stays in place.


def _split_blocks(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    headers = [number for number, line in enumerate(lines) if _QUARANTINE_HEADER.match(line)]
    starts: list[int] = []
    for header in headers:
        start = header
        while start > 0 and lines[start - 1].lstrip().startswith("#"):
            start -= 1
        # A comment that runs from the top of the file straight into the first entry is the
        # file's header, not the entry's: it stays on top.
        if not starts and start == 0:
            start = header
        starts.append(start)
    if not starts:
        return _strip_blank(lines), []
    preamble = _strip_blank(lines[: starts[0]])
    bounds = [*starts, len(lines)]
    blocks = [_strip_blank(lines[begin:end]) for begin, end in itertools.pairwise(bounds)]
    return preamble, blocks


def _strip_blank(lines: list[str]) -> list[str]:
    lines = list(lines)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _join(preamble: list[str], blocks: list[list[str]]) -> str:
    parts = ["\n".join(preamble)] if preamble else []
    parts += ["\n".join(block) for block in blocks]
    return "\n\n".join(parts) + "\n"


def _render(values: dict[str, Any]) -> list[str]:
    return ["[[quarantine]]"] + [f"{key} = {tomlkit.item(values[key]).as_string()}" for key in KEYS]


def _insert_block(text: str, block: list[str]) -> str:
    lines = text.split("\n")
    preamble, blocks = _split_blocks(lines)
    blocks.append(block)
    blocks.sort(key=_block_test)
    return _join(preamble, blocks)


def _block_test(block: list[str]) -> str:
    # Parsing one block alone is enough: the whole file was validated before the edit.
    header = next(n for n, line in enumerate(block) if _QUARANTINE_HEADER.match(line))
    test: str = tomllib.loads("\n".join(block[header:]))["quarantine"][0]["test"]
    return test


def _write_validated(path: Path, text: str) -> list[Entry]:
    """Check ``text`` is a valid quarantine, then replace ``path`` with it atomically: readers
    see the old file or the new one, never half of it, and a failure leaves the old one."""
    try:
        entries = _parse(path, text)
    except QuarantineError as error:  # pragma: no cover - a bug in the editing above
        raise QuarantineError(
            path,
            0,
            f"refusing to write an invalid file ({error.problem}); "
            "the file is unchanged: please report this bug",
        ) from error

    atomic.write_text(path, text)
    return entries
