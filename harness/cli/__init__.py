"""The ``harness`` command line.

Each command group lives in its own module of this package and knows only the library module
it fronts (``harness.environment``, ``harness.artifacts``, ...); this module only assembles them.
"""

from __future__ import annotations

import sys

import click

from harness import __version__
from harness.processes import SIGTERM_EXIT, interrupt_on_sigterm, sigterm_received


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="harness")
def main() -> None:
    """ml-harness: tiered, seeded test suites, quarantine, flake hunting, environment checks,
    artifact validation and performance gates for ML training code.

    Start with `harness ci` (the whole pipeline the GitHub workflow runs) or
    `harness run --tier unit` (one tier, with reports in reports/).
    """


def _register() -> None:
    from harness.cli import (
        artifacts,
        env,
        flaky,
        history,
        impact,
        init,
        mutate,
        perf,
        quarantine,
        reports,
        runs,
        tolerances,
    )

    main.add_command(env.env)
    main.add_command(artifacts.artifacts)
    main.add_command(quarantine.quarantine)
    main.add_command(perf.perf)
    main.add_command(reports.report)
    main.add_command(mutate.mutate_command)
    for command in runs.COMMANDS:
        main.add_command(command)
    main.add_command(flaky.flaky_command)
    main.add_command(init.init_command)
    main.add_command(history.history)
    main.add_command(tolerances.tolerances)
    main.add_command(impact.impact)


_register()


def run() -> None:
    """The ``harness`` program (the console script and ``python -m harness.cli``): a SIGTERM
    (a cancelled CI job, ``timeout``) interrupts the command as Ctrl-C does, so the processes
    it started (asv's, mutmut's, pytest's) are ended with it and partial reports are written
    (harness/processes.py); the program then exits 143, as a process ended by SIGTERM does.
    Not in :func:`main`, which tests invoke in their own process."""
    interrupt_on_sigterm()
    try:
        main()
    except BaseException:
        # Click turns the interrupt into "Aborted!" and exit 1; pipeline's Ctrl-C path exits
        # 130: after a SIGTERM the exit is 143 whichever path ran.
        if sigterm_received():
            sys.exit(SIGTERM_EXIT)
        raise
