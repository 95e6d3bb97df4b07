"""`harness report merge`: one summary and one gate decision from the shards of a run."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from harness import merge as _merge
from harness import report as _report
from harness import shards as _shards


@click.group(name="report")
def report() -> None:
    """Reports of runs: merge the shards of one run (`harness run --shard K/N`)."""


@report.command(
    name="merge",
    epilog="""\b
Fails (exit 1) when any shard failed a test, when a quarantine entry is expired or stale,
and when the shards do not add up to one whole run: a shard missing, unreadable or stopped
early, shards with different seeds or collections, a test run in no shard or in two.
Example (GitHub: each shard's artifact downloaded into reports/shards/<name>/):
  harness report merge reports/shards/* --expect-shards 2 --report-dir reports/merged
""",
)
@click.argument("folders", nargs=-1, type=click.Path(path_type=Path), metavar="[DIR]...")
@click.option(
    "--report-dir",
    type=click.Path(path_type=Path),
    default=Path("reports/merged"),
    show_default=True,
    help="Where the merged junit.xml, report.json and summary.md are written.",
)
@click.option(
    "--expect-shards",
    type=click.IntRange(min=1, max=_shards.MAX_SHARDS),
    default=None,
    metavar="N",
    help="The number of shards the run was split into (default: what the shards' reports "
    "say). Give it in CI: then even a run whose every report is lost fails by name.",
)
def merge_command(folders: tuple[Path, ...], report_dir: Path, expect_shards: int | None) -> None:
    """Merge shard folders DIR... (each holding one shard's junit.xml, report.json and
    summary.md) into one junit.xml, report.json and summary.md, printed and appended to
    $GITHUB_STEP_SUMMARY when that is set.

    No DIR at all is allowed (a CI glob that matched nothing): with --expect-shards N that
    reports all N shards missing, and fails."""
    result = _merge.merge(folders, expect=expect_shards)
    written = _merge.write(result, report_dir)
    _report.append_step_summary(result.markdown)
    click.echo(result.markdown)
    click.echo("reports: " + ", ".join(map(str, written)))
    for line in result.report["reruns"]:
        click.echo(f"harness report merge: re-run: {line}: failing", err=True)
    for line in result.report["rerun_notes"]:
        click.echo(f"harness report merge: WARNING: {line}", err=True)
    if result.problems:
        click.echo(
            f"harness report merge: the shards do not add up to one run ({len(result.problems)} "
            "problem(s) above): failing",
            err=True,
        )
    sys.exit(0 if result.passed else 1)
