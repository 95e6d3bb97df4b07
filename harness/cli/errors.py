"""Errors shared by the command groups.

Every command reports bad input one way: the library raises its own error (a ``ValueError``
subclass such as ``TierConfigError`` or ``QuarantineError``, naming the bad value and the fix)
and the command turns it into ``UsageProblem``, exit status 2.
"""

import click


class UsageProblem(click.ClickException):
    """A problem with what a command was given (a missing or malformed input file, a refused
    edit): printed as ``Error: ...`` with exit status 2, like click's own usage errors, so it
    is never mistaken for the command's verdict (1: drift, invalid artifact, expired entry)."""

    exit_code = 2
