"""`harness env`: check the installed distributions against the lock; print the fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from harness import environment
from harness.cli.errors import UsageProblem


@click.group(name="env")
def env() -> None:
    """Check the environment against the lock file and describe the machine.

    \b
    Examples:
      harness env check                                 # .venv vs requirements/cpu.lock
      harness env check --lock requirements/gpu.lock    # on a GPU runner
      harness env check --json > drift.json
      harness env fingerprint --json
    """


@env.command(name="check")
@click.option(
    "--lock",
    "lock_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Lock file to compare with. [default: requirements/cpu.lock of the project root, "
    "the nearest directory above the current one with a pyproject.toml]",
)
@click.option(
    "--allow-extra",
    is_flag=True,
    help="Report distributions the lock does not name without failing: for a GPU runner whose "
    "venv sees the image's own packages (CUDA libraries and the like) through "
    "--system-site-packages. Missing and wrong versions still fail.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the drift as JSON on stdout.")
def check(lock_path: Path | None, allow_extra: bool, as_json: bool) -> None:
    """Compare the installed distributions with a lock file, package by package.

    Lists what is missing (locked, not installed), extra (installed, not locked; pip,
    setuptools, wheel and ml-harness itself are ignored) and of the wrong version. Pins match
    PEP 440 style, so 'torch==2.13.0' accepts the installed '2.13.0+cpu'; the GPU lock's ranges
    ('torch>=2.11,<2.15') accept any build in range.

    Exit status: 0 the environment matches, 1 drift, 2 the lock is missing or malformed.

    \b
    Examples:
      harness env check
      harness env check --lock requirements/gpu.lock --allow-extra --json
    """
    lock_path = lock_path or environment.default_lock_path()
    try:
        drift = environment.check(lock_path)
    except environment.LockFileError as exc:
        raise UsageProblem(str(exc)) from None

    if as_json:
        click.echo(json.dumps(drift.to_dict(), indent=2))
    else:
        _print_drift(drift)
    if drift.missing or drift.wrong_version or (drift.extra and not allow_extra):
        raise SystemExit(1)


def _print_drift(drift: environment.Drift) -> None:
    console = Console(highlight=False)
    if drift.clean:
        console.print(f"OK: the environment matches {drift.lock} ({drift.locked} packages)")
        return
    table = Table(title=f"Drift from {drift.lock}", title_justify="left")
    table.add_column("package")
    table.add_column("problem")
    table.add_column("installed")
    table.add_column("lock wants")
    for problem, packages in (
        ("missing", drift.missing),
        ("wrong version", drift.wrong_version),
        ("extra", drift.extra),
    ):
        for p in packages:
            table.add_row(p.name, problem, p.installed or "-", p.wanted or "-")
    console.print(table)
    console.print(
        f"DRIFT: {len(drift.missing)} missing, {len(drift.wrong_version)} wrong version, "
        f"{len(drift.extra)} extra. Rebuild the venv from the lock (rm -rf .venv && make venv) "
        "or, if the change is wanted, edit requirements/cpu.in and run `make lock`."
    )


@env.command(name="fingerprint")
@click.option("--json", "as_json", is_flag=True, help="Print the fingerprint as JSON on stdout.")
def fingerprint(as_json: bool) -> None:
    """Describe this machine and stack: python, platform, CPUs, torch, triton, numpy, CUDA,
    GPUs and driver, hostname, git commit. Every report is stamped with the same dict.

    \b
    Examples:
      harness env fingerprint
      harness env fingerprint --json | jq .gpus
    """
    info = environment.fingerprint()
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    table = Table(show_header=False, box=None)
    for key, value in info.items():
        shown = ", ".join(value) if isinstance(value, list) else value
        table.add_row(key, "-" if shown in (None, "") else str(shown))
    Console(highlight=False).print(table)
