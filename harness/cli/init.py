"""`harness init`: the harness over a project's existing tests (harness.adopt)."""

from __future__ import annotations

from pathlib import Path

import click

from harness import adopt as _adopt
from harness.cli.errors import UsageProblem


@click.command(
    name="init",
    epilog="""\b
Example, at the top of a repository with its tests in tests/:
  pip install ml-harness
  harness init                 # writes [tool.harness] and quarantine.toml; moves nothing
  harness run                  # every tier, reports in reports/
  harness ci --no-perf         # the pull-request mode: what the change since the default
                               # branch reaches (pip install 'ml-harness[ci]' for workers)
""",
)
@click.option("--dry-run", is_flag=True, help="Print what would be written; write nothing.")
@click.option(
    "--workflow",
    "source",
    metavar="OWNER/REPO@REF",
    help="Also write .github/workflows/harness.yml, calling the reusable harness-tiers.yml "
    "of that repository and commit.",
)
def init_command(dry_run: bool, source: str | None) -> None:
    """Set the harness up in the current repository without moving a file: find the test
    folder (tests/, test/ or suites/) and the configuration file, write the tier mapping and
    an empty quarantine.toml. See docs/adopting.md."""
    try:
        plan = _adopt.plan(Path.cwd())
    except _adopt.InitError as exc:
        raise UsageProblem(str(exc)) from None
    click.echo(f"test folder: {plan.suites_dir}/ ({plan.test_files} test file(s))")
    tiers = [*plan.folder_tiers, *([plan.catch_all] if plan.catch_all else [])]
    for name in plan.folder_tiers:
        click.echo(f"  tier {name}: {plan.suites_dir}/{name}/")
    if plan.catch_all:
        click.echo(f"  tier {plan.catch_all}: the other test files of {plan.suites_dir}/")
    click.echo(f"configuration: {plan.config_file} (a table pytest does not read: no warnings")
    click.echo("  for teammates who run pytest without the plugin)")
    try:
        # Checked before anything is written: a bad --workflow leaves the project untouched.
        workflow = _adopt.caller_workflow(plan, source) if source else None
        if workflow and (plan.root / _adopt.WORKFLOW_PATH).exists():
            raise _adopt.InitError(f"{_adopt.WORKFLOW_PATH} exists already; not overwritten")
    except _adopt.InitError as exc:
        raise UsageProblem(str(exc)) from None
    if dry_run:
        click.echo("--dry-run: nothing written")
        return
    try:
        written = _adopt.apply(plan)
        if workflow:
            written.append(_adopt.write_workflow(plan, workflow))
    except (_adopt.InitError, OSError) as exc:
        raise UsageProblem(str(exc)) from None
    for line in written:
        click.echo(f"wrote {line}")
    click.echo(
        f"next: pytest (or harness run) runs the tiers {', '.join(tiers)}; "
        "harness ci --no-perf selects what a branch changes"
    )
