"""`harness quarantine`: list, add and remove entries of ``quarantine.toml``.

A thin layer over ``harness.quarantine``: every rule (what a valid entry is, how long a
quarantine may last, how the file is edited) lives there.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import click

from harness import quarantine as q
from harness.cli.errors import UsageProblem

# Exit statuses, shared by the three commands.
EXIT_EXPIRED = 1  # `list`: at least one entry has expired
EXIT_REFUSED = 2  # the file is malformed or the edit was refused; nothing was written


_file_option = click.option(
    "--file",
    "file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=q.FILENAME,
    show_default=True,
    help="The quarantine file.",
)


@click.group(name="quarantine")
def quarantine() -> None:
    """Quarantine flaky tests: visibly, with a reason, a tracking issue and an expiry.

    A quarantined test still runs on every CI run; its failures are reported but do not fail
    the gate. Nothing is retried. An expired entry fails the gate: fix the test and remove the
    entry, or renew it in a reviewed change.

    \b
    Examples:
      harness quarantine list
      harness quarantine add 'suites/unit/test_x.py::test_y' \\
          --reason 'fails about 1 in 50 on the GPU runner' \\
          --issue https://github.com/ORG/REPO/issues/123
      harness quarantine remove 'suites/unit/test_x.py::test_y'
    """


@quarantine.command(name="list")
@_file_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the entries as a JSON list (with days_left and expired) instead.",
)
def list_(file: Path, as_json: bool) -> None:
    """Show every quarantined test, its reason, issue and how many days it has left.

    \b
    Exit status:
      0  no entry has expired
      1  at least one entry has expired (highlighted; it fails the gate)
      2  the file is malformed (the message gives the line and the fix)

    \b
    Examples:
      harness quarantine list
      harness quarantine list --json | jq -r '.[] | select(.expired) | .test'
    """
    entries = _load(file)
    today = datetime.date.today()
    expired = [entry for entry in entries if entry.is_expired(today)]

    if as_json:
        click.echo(json.dumps([_as_json(entry, today) for entry in entries], indent=2))
    elif not entries:
        missing = "" if file.exists() else f" ({file} does not exist)"
        click.echo(f"No quarantined tests{missing}.")
    else:
        _print_table(entries, today)
        click.echo()
        summary = f"{len(entries)} quarantined test{'s' if len(entries) != 1 else ''} in {file}"
        if expired:
            click.secho(
                f"{summary}, {len(expired)} expired: fix each and run `harness "
                "quarantine remove TEST`, or renew it in a reviewed change.",
                fg="red",
                bold=True,
            )
        else:
            click.echo(f"{summary}; none expired.")
    if expired:
        raise SystemExit(EXIT_EXPIRED)


@quarantine.command()
@click.argument("test")
@click.option(
    "--reason",
    required=True,
    help="How the test fails and how often, e.g. 'fails about 1 in 50 on the GPU runner'.",
)
@click.option(
    "--issue", required=True, metavar="URL", help="http(s) link to the issue that tracks the fix."
)
@click.option(
    "--days",
    type=click.IntRange(1, q.MAX_DAYS),
    default=None,
    help=f"Quarantine for this many days from today [default: {q.DEFAULT_DAYS}; "
    f"at most {q.MAX_DAYS}].",
)
@click.option(
    "--expires",
    type=click.DateTime(formats=["%Y-%m-%d"]),
    default=None,
    metavar="YYYY-MM-DD",
    help=f"Last day of the quarantine instead of --days (at most {q.MAX_DAYS} days from today).",
)
@_file_option
def add(
    test: str,
    reason: str,
    issue: str,
    days: int | None,
    expires: datetime.datetime | None,
    file: Path,
) -> None:
    """Quarantine TEST, a pytest node id as pytest prints it.

    TEST must name a test that exists: its file inside the project (the folder holding the
    quarantine file) and the function (or class) in that file. Give it after `--` when it
    could look like an option; ids starting with '-', with '..' parts, absolute paths or
    control characters are refused.

    Without a [param] suffix the entry covers every parametrization of the test. The entry
    is dated today and expires after --days (default 30) or on --expires; the file stays
    sorted by test id and keeps its comments. Exit status 2 when refused (malformed file,
    duplicate, bad node id or URL): nothing is written.

    \b
    Examples:
      harness quarantine add 'suites/unit/test_x.py::test_y' \\
          --reason 'fails about 1 in 50 on the GPU runner' \\
          --issue https://github.com/ORG/REPO/issues/123
      harness quarantine add 'suites/gpu/test_attn.py::test_bwd[bf16]' --days 14 \\
          --reason 'dq mismatch 1e-2 on H100 only' --issue https://github.com/ORG/REPO/issues/7
    """
    if days is not None and expires is not None:
        raise UsageProblem("give --days or --expires, not both")
    try:
        entry = q.add(
            file,
            test,
            reason=reason,
            issue=issue,
            expires=expires.date() if expires else None,
            days=days if days is not None else q.DEFAULT_DAYS,
            # The project is where the quarantine file lives (pytest's rootdir, by default).
            root=file.resolve().parent,
        )
    except (q.QuarantineError, OSError) as error:
        raise UsageProblem(str(error)) from None
    left = entry.days_left(datetime.date.today())
    click.echo(
        f"Quarantined {entry.test} until {entry.expires} ({left} days) at {file}:{entry.line}."
    )
    click.echo("It still runs; its failures are reported but no longer fail the gate.")


@quarantine.command()
@click.argument("test")
@_file_option
def remove(test: str, file: Path) -> None:
    """Take TEST out of quarantine (its exact node id, as `list` shows it).

    Run this once the test is fixed. Exit status 2 when refused (malformed file, or no entry
    for TEST: the message names the closest entries); nothing is written.

    \b
    Example:
      harness quarantine remove 'suites/unit/test_x.py::test_y'
    """
    try:
        entry = q.remove(file, test)
    except (q.QuarantineError, OSError) as error:
        raise UsageProblem(str(error)) from None
    click.echo(
        f"Removed {entry.test} from {file} (quarantined since {entry.added}: {entry.reason})."
    )


def _load(file: Path) -> list[q.Entry]:
    try:
        return q.load(file)
    except (q.QuarantineError, OSError) as error:
        raise UsageProblem(str(error)) from None


def _as_json(entry: q.Entry, today: datetime.date) -> dict[str, Any]:
    return {
        "test": entry.test,
        "reason": entry.reason,
        "issue": entry.issue,
        "added": entry.added.isoformat(),
        "expires": entry.expires.isoformat(),
        "days_left": entry.days_left(today),
        "expired": entry.is_expired(today),
        "line": entry.line,
    }


def _print_table(entries: list[q.Entry], today: datetime.date) -> None:
    header = ("TEST", "DAYS LEFT", "EXPIRES", "ADDED", "ISSUE", "REASON")
    rows = []
    for entry in entries:
        left = entry.days_left(today)
        days = f"EXPIRED {-left}d ago" if left < 0 else str(left)
        rows.append(
            (
                entry.test,
                days,
                entry.expires.isoformat(),
                entry.added.isoformat(),
                entry.issue,
                entry.reason,
            )
        )
    # The reason is last and unpadded: it is the one free-text column.
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(5)]

    def format_row(row: tuple[str, ...]) -> str:
        return "  ".join(
            [cell.ljust(width) for cell, width in zip(row, widths, strict=False)] + [row[5]]
        )

    click.secho(format_row(header), bold=True)
    for entry, row in zip(entries, rows, strict=True):
        if entry.is_expired(today):
            click.secho(format_row(row), fg="red", bold=True)
        else:
            click.echo(format_row(row))
