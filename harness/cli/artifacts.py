"""`harness artifacts`: placeholder, filled in by its own change."""

import click


@click.group(name="artifacts")
def artifacts() -> None:
    """(not implemented yet)"""
