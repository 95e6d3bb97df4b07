"""Store a ``harness run``/``harness ci`` report directory as a run, so that the platform's own
test history is searchable (``metrics.tests_failed > 0 and created > -7d``).

The directory holds ``report.json`` (required), ``junit.xml`` and ``summary.md``. The run:
name = the directory's name; created = the report's start time; status finished when the
pytest exit status was 0, else failed; params = seed, deterministic, ci, hypothesis profile;
metrics (step 0) = tests per outcome overall (``tests_passed``...) and per tier
(``unit.passed``...), ``duration_s``; tags = exit status, seed source; environment = the
fingerprint; the three files as artifacts of kind ``report``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from reference_impls.tracking.client import Tracker
from reference_impls.tracking.errors import TrackingError
from reference_impls.tracking.metadata import RunStatus, check_metric

__all__ = ["import_report"]

FILES = ("report.json", "junit.xml", "summary.md")


def _key(text: str) -> str:
    """``text`` as a metric name part: odd characters as '_', never a leading digit or dot
    (a metric name starts with a letter or '_')."""
    key = re.sub(r"[^A-Za-z0-9_.\-/]", "_", text) or "_"
    return key if key[0].isalpha() or key[0] == "_" else "_" + key


def import_report(tracker: Tracker, directory: str | Path, *, project: str = "harness") -> str:
    """Create a run from a report directory; returns the run id."""
    d = Path(directory)
    if not d.is_dir():
        raise TrackingError(f"{d} is not a directory; pass a harness report directory (reports/)")
    path = d / "report.json"
    try:
        report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TrackingError(
            f"{d} has no report.json; is it a `harness run` report directory?"
        ) from None
    except ValueError as exc:
        raise TrackingError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(report, dict) or not isinstance(report.get("tests"), list):
        raise TrackingError(f"{path} is not a harness JSON report (no 'tests' list)")
    bad = next((i for i, t in enumerate(report["tests"]) if not isinstance(t, dict)), None)
    if bad is not None:
        raise TrackingError(
            f"{path}: tests[{bad}] is {type(report['tests'][bad]).__name__}, not an object "
            "with 'outcome' and 'tier'"
        )
    try:
        started = dt.datetime.fromisoformat(str(report["started"])).timestamp()
    except (KeyError, ValueError):
        started = path.stat().st_mtime
    overall: Counter[str] = Counter()
    per_tier: Counter[str] = Counter()
    for test in report["tests"]:
        outcome = str(test.get("outcome", "unknown"))
        overall[outcome] += 1
        per_tier[f"{_key(str(test.get('tier') or 'untiered'))}.{_key(outcome)}"] += 1
    metrics: dict[str, float] = {f"tests_{_key(k)}": v for k, v in overall.items()}
    metrics["tests_total"] = sum(overall.values())
    metrics.update(per_tier)
    if isinstance(report.get("duration_s"), int | float):
        metrics["duration_s"] = float(report["duration_s"])
    params = {
        k: report[k]
        for k in ("seed", "deterministic", "ci", "hypothesis_profile")
        if isinstance(report.get(k), bool | int | float | str)
    }
    for key, value in metrics.items():
        # Checked before the run exists: a bad value must not leave a run half imported.
        check_metric(key, value, 0)
    exit_status = report.get("exit_status")
    env = report.get("environment") if isinstance(report.get("environment"), dict) else None
    commit = None
    if env:
        commit = next((str(v) for k, v in env.items() if "commit" in k.lower() and v), None)
    run_id: str = tracker.backend.create_run(
        project,
        name=d.resolve().name[:200],
        params=params,
        tags={"exit_status": str(exit_status), "seed_source": str(report.get("seed_source"))},
        git_commit=commit,
        environment=env,
        created_at=started,
    )
    from reference_impls.tracking.client import Run

    run = Run(tracker, run_id, project)
    run.log_metrics(metrics, step=0)
    for name in FILES:
        if (d / name).is_file():
            run.log_artifact(d / name, name, kind="report")
    run.finish(RunStatus.FINISHED if exit_status == 0 else RunStatus.FAILED)
    return run_id
