"""Runs from reports: the harness JSON report (``report.json``) and any tool's JUnit XML.

A harness report carries everything the scores use: pytest node ids, each test's seed, the
run's commit and environment fingerprint. A JUnit file from another tool carries outcomes and
durations only: its tests are named ``classname::name`` (what every JUnit writer records), with
no seeds unless a harness property says so, and its commit and runner come from the caller.

A run's key is a digest of what it says (not of when it was imported), so importing one CI
artifact twice adds it once.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.history.records import HistoryError, RunRecord, TestResult

__all__ = ["from_file", "from_harness_report", "from_junit", "git_tree", "runner_name"]

_KNOWN = frozenset({"passed", "failed", "error", "skipped", "quarantined", "xfailed", "xpassed"})


def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def runner_name(environment: Mapping[str, Any] | None = None) -> str | None:
    """The machine a run ran on: ``$HARNESS_RUNNER``, else the CI runner's name
    (``$RUNNER_NAME``), else the fingerprint's host name."""
    for var in ("HARNESS_RUNNER", "RUNNER_NAME"):
        if os.environ.get(var):
            return os.environ[var]
    host = (environment or {}).get("hostname")
    return str(host) if host else None


def git_tree(commit: str | None, cwd: Path | None = None) -> str | None:
    """The tree of ``commit`` (None when git or the commit is unavailable)."""
    if not commit:
        return None
    try:
        out = subprocess.run(
            ["git", "rev-parse", f"{commit}^{{tree}}"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    tree = out.stdout.strip()
    return tree if out.returncode == 0 and tree else None


def _started(text: Any, fallback: float) -> float:
    if not text:
        return fallback
    try:
        when = dt.datetime.fromisoformat(str(text))
    except ValueError:
        return fallback
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value) if value is not None and value != "" else None
    except (TypeError, ValueError):
        return None


def from_harness_report(
    report: Mapping[str, Any],
    *,
    label: str | None = None,
    commit: str | None = None,
    runner: str | None = None,
    cwd: Path | None = None,
    fallback_time: float = 0.0,
) -> RunRecord:
    """A run from a harness JSON report (``report.json`` of ``harness run`` or of
    ``harness report merge``). ``commit``/``runner`` override what the report says."""
    tests = report.get("tests")
    if not isinstance(tests, list):
        raise HistoryError(f"{label or 'report'}: not a harness JSON report (no 'tests' list)")
    results = []
    for i, t in enumerate(tests):
        if not isinstance(t, Mapping) or not isinstance(t.get("nodeid"), str):
            raise HistoryError(f"{label or 'report'}: test #{i} has no node id: {t!r:.200}")
        outcome = str(t.get("outcome"))
        if outcome not in _KNOWN:
            raise HistoryError(
                f"{label or 'report'}: test {t['nodeid']!r} has unknown outcome {outcome!r} "
                f"(expected one of {', '.join(sorted(_KNOWN))})"
            )
        duration = t.get("duration_s")
        results.append(
            TestResult(
                t["nodeid"],
                outcome,
                float(duration) if isinstance(duration, int | float) else None,
                _int_or_none(t.get("seed")),
            )
        )
    env = report.get("environment") or {}
    env = env if isinstance(env, Mapping) else {}
    commit = commit or env.get("git_commit")
    # A dirty checkout ran code no commit names: no tree, so it never counts as "the same code".
    tree = None if env.get("git_dirty") else git_tree(commit, cwd)
    key = _digest(
        [
            "harness",
            report.get("started"),
            report.get("seed"),
            commit,
            [(r.nodeid, r.outcome, r.seed) for r in results],
        ]
    )
    return RunRecord(
        run_key=key,
        started_at=_started(report.get("started"), fallback_time),
        source="harness",
        results=results,
        commit=str(commit) if commit else None,
        tree=tree,
        runner=runner or runner_name(env),
        fingerprint=_digest(dict(env)) if env else None,
        seed=_int_or_none(report.get("seed")),
        status=str(report.get("status")) if report.get("status") else None,
        label=label,
    )


def _junit_outcome(case: ET.Element) -> str:
    props = {
        p.get("name"): p.get("value") for p in case.iter("property") if p.get("name") is not None
    }
    for child in case:
        if child.tag == "failure":
            return "failed"
        if child.tag == "error":
            return "error"
        if child.tag == "skipped":
            # The harness writes a quarantined failure as a skip of type pytest.xfail; so does
            # pytest for an xfail, which the quarantined property tells apart.
            if child.get("type") == "pytest.xfail":
                return "quarantined" if "harness_quarantined" in props else "xfailed"
            return "skipped"
    return "passed"


def from_junit(
    path: Path,
    *,
    commit: str | None = None,
    runner: str | None = None,
    tree: str | None = None,
) -> RunRecord:
    """A run from a JUnit XML file (pytest's, or any other tool's)."""
    try:
        data = Path(path).read_bytes()
        root = ET.fromstring(data)
    except OSError as exc:
        raise HistoryError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ET.ParseError as exc:
        raise HistoryError(f"{path}: not well-formed XML ({exc})") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise HistoryError(
            f"{path}: not a JUnit report (root element <{root.tag}>, expected <testsuites> "
            "or <testsuite>)"
        )
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    results: list[TestResult] = []
    stamps: list[str] = []
    for suite in suites:
        if suite.get("timestamp"):
            stamps.append(str(suite.get("timestamp")))
        for case in suite.findall("testcase"):
            name = case.get("name")
            if not name:
                raise HistoryError(f"{path}: a <testcase> without a name attribute")
            classname = case.get("classname")
            seed = next(
                (
                    _int_or_none(p.get("value"))
                    for p in case.iter("property")
                    if p.get("name") == "harness_seed"
                ),
                None,
            )
            try:
                duration: float | None = float(case.get("time") or "")
            except ValueError:
                duration = None
            results.append(
                TestResult(
                    f"{classname}::{name}" if classname else name,
                    _junit_outcome(case),
                    duration,
                    seed,
                )
            )
    fallback = Path(path).stat().st_mtime
    return RunRecord(
        run_key=_digest(["junit", hashlib.sha256(data).hexdigest()]),
        started_at=min((_started(s, fallback) for s in stamps), default=fallback),
        source="junit",
        results=results,
        commit=commit,
        tree=tree or git_tree(commit),
        runner=runner,
        label=str(path),
    )


def from_file(
    path: Path, *, commit: str | None = None, runner: str | None = None, tree: str | None = None
) -> RunRecord:
    """A run from a harness ``report.json`` (by its ``.json`` suffix) or a JUnit XML file."""
    path = Path(path)
    if path.suffix == ".json":
        try:
            report = json.loads(path.read_text())
        except OSError as exc:
            raise HistoryError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        except ValueError as exc:
            raise HistoryError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(report, Mapping):
            raise HistoryError(f"{path}: not a harness JSON report (not a JSON object)")
        record = from_harness_report(
            report,
            label=str(path),
            commit=commit,
            runner=runner,
            fallback_time=path.stat().st_mtime,
        )
        if tree:
            record.tree = tree
        return record
    return from_junit(path, commit=commit, runner=runner, tree=tree)
