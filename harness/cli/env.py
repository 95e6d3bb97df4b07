"""`harness env`: placeholder, filled in by its own change."""

import click


@click.group(name="env")
def env() -> None:
    """(not implemented yet)"""
