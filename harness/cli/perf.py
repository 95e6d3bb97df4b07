"""`harness perf`: placeholder, filled in by its own change."""

import click


@click.group(name="perf")
def perf() -> None:
    """(not implemented yet)"""
