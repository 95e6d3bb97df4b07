"""`harness report merge`: one summary and one gate decision from the shards of a run;
`harness report durations`: the shards' durations file from the reports of runs that happened."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from harness import atomic
from harness import merge as _merge
from harness import report as _report
from harness import shards as _shards
from harness.cli.errors import UsageProblem


@click.group(name="report")
def report() -> None:
    """Reports of runs: merge the shards of one run (`harness run --shard K/N`); refresh the
    durations the shards split by from runs' reports."""


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


@report.command(
    name="durations",
    epilog="""\b
Examples (no test is run again; the reports' recorded times are used):
  harness report durations reports/unit-property/report.json  # ci.yml's merged shards
  make test ARGS=--harness-json=reports/full.json             # or a full local run, then
  harness report durations reports/full.json --tier unit,property --replace
""",
)
@click.argument("reports", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--durations-path",
    type=click.Path(path_type=Path),
    default=Path(_shards.DURATIONS_FILE),
    show_default=True,
    help="pytest-split's durations file to update (JSON: node id -> seconds).",
)
@click.option(
    "--tier",
    "tiers",
    metavar="TIER[,TIER]",
    default=None,
    help="Only tests of these tiers (the tiers that are sharded: ci.yml shards unit,property). "
    "Default: every test in the reports.",
)
@click.option(
    "--replace",
    is_flag=True,
    help="Drop the file's entries that no report has (deleted or renamed tests, other tiers) "
    "instead of keeping them.",
)
def durations_command(
    reports: tuple[Path, ...], durations_path: Path, tiers: str | None, replace: bool
) -> None:
    """Update the durations file that `harness run --shard` splits by from the JSON reports
    (report.json) of runs that already happened, instead of running the tests again with
    `harness run --store-durations`. Each test's time is its set-up + call + tear-down, as
    pytest-split records it; a test in several reports gets the mean. Tests that were skipped
    or errored keep the time the file had. Entries of tests not in any report are kept unless
    --replace is given."""
    tier_names = [t.strip() for t in tiers.split(",") if t.strip()] if tiers is not None else None
    try:
        old = _shards.check_durations(durations_path) or {}
        parsed = [(str(path), _report.load(path)) for path in reports]
        new = _shards.durations_from_reports(parsed, tier_names)
    except (OSError, ValueError) as exc:  # ShardError is a ValueError
        raise UsageProblem(str(exc)) from None
    if not new:
        raise UsageProblem(
            f"no timed test in {', '.join(map(str, reports))}"
            + (f" of tier(s) {', '.join(tier_names)}" if tier_names else "")
            + f"; {durations_path} left as it was"
        )
    # A test the reports hold but did not time (skipped, errored) is still a test: --replace
    # keeps its old time; only the entries of tests no report mentions go.
    seen = {t.get("nodeid") for _, report in parsed for t in report["tests"]}
    added = sorted(set(new) - set(old))
    updated = sorted(set(new) & set(old))
    dropped = sorted(set(old) - seen) if replace else []
    merged = {k: v for k, v in old.items() if k not in dropped} | new
    durations_path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(durations_path, _shards.durations_text(merged))
    kept = len(merged) - len(new)
    click.echo(
        f"{durations_path}: {len(new)} test time(s) from {len(reports)} report(s): "
        f"{len(added)} new, {len(updated)} updated, {len(dropped)} dropped, {kept} kept; "
        f"{len(merged)} in all, {sum(merged.values()):.1f} s"
    )
