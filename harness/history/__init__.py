"""Test history: every run's outcomes kept, flakiness scored from them.

``harness run``, ``harness ci`` and ``harness report merge`` append their JSON report here when
``$HARNESS_HISTORY_DB`` names a database (a SQLite file path, or ``postgresql://...`` for a
team); ``harness history import`` adds reports made elsewhere (CI artifacts, other tools' JUnit
files); ``harness history flaky`` scores every test over a window and proposes quarantine
edits. Appending is off unless configured: a run should not grow a database nobody asked for,
and the suite's own tests start hundreds of nested runs that must not each open one.

``records`` (data and errors), ``ingest`` (reports to runs) and ``scores`` (verdicts) import no
database code; ``store`` (SQLAlchemy, Alembic) is imported only when a database is opened.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.history.records import HistoryError

__all__ = ["ENV_VAR", "HistoryError", "configured_url", "record_run"]

ENV_VAR = "HARNESS_HISTORY_DB"


def configured_url(env: Mapping[str, str] | None = None) -> str | None:
    """The history database the environment names, or None (appending is off)."""
    value = (os.environ if env is None else env).get(ENV_VAR, "").strip()
    return value or None


def record_run(report: Mapping[str, Any] | None, label: Path | str) -> bool | None:
    """Append a finished run's JSON report to the configured history; never raises.

    Returns None when no history is configured (or there is no report), True when the run was
    appended, False when it could not be: the reason is printed as one warning line on stderr.
    The run's verdict is the caller's and does not change either way: history is a record of
    runs, not a step that can pass or fail them.
    """
    url = configured_url()
    if url is None or report is None:
        return None
    try:
        from harness.history.ingest import from_harness_report
        from harness.history.store import open_store

        record = from_harness_report(report, label=str(label))
        with open_store(url) as store:
            store.append(record)
        return True
    except Exception as exc:  # the run's verdict must survive any history problem
        detail = " ".join(str(exc).split()) or type(exc).__name__
        from harness.history.store import safe_url

        print(
            f"warning: test history not updated ({ENV_VAR}={safe_url(url)}): {detail[:500]}",
            file=sys.stderr,
        )
        return False
