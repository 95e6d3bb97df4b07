"""Optional dependencies, checked before a command starts its work.

The core install (``pip install ml-harness``) is the pytest plugin and the commands that need
nothing more. What a command needs beyond it is an extra of the package; a command that needs
one checks it up front and stops with exit status 2 and the install line, instead of failing
half-way (pytest's "unrecognized arguments: --numprocesses=auto") or, worse, passing.
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "missing"]

EXTRAS: dict[str, tuple[str, str]] = {
    # module imported: (distribution, extra that installs it)
    "xdist": ("pytest-xdist", "ci"),
    "pytest_split": ("pytest-split", "ci"),
    "asv": ("asv", "perf"),
    "mutmut": ("mutmut", "mutate"),
    "scipy": ("scipy", "tolerances"),
    "sqlalchemy": ("SQLAlchemy", "history"),
    "alembic": ("alembic", "history"),
}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing(module: str, needed_for: str) -> str | None:
    """None when ``module`` can be imported, else the message: what needs it and the install
    line (``needed_for`` reads as "--workers auto", "the perf gate")."""
    if _importable(module):
        return None
    dist, extra = EXTRAS[module]
    return f"{needed_for} needs {dist}, which is not installed: pip install 'ml-harness[{extra}]'"
