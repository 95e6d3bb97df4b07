"""`harness quarantine`: placeholder, filled in by its own change."""

import click


@click.group(name="quarantine")
def quarantine() -> None:
    """(not implemented yet)"""
