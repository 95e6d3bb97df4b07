"""Reports of a run: the markdown summary rendered from the plugin's JSON report.

``harness run`` asks pytest for three files in its report directory:

``junit.xml``    pytest's JUnit XML (each test case carries ``harness_tier``, ``harness_seed``
                 and, when quarantined, ``harness_quarantined`` properties; a quarantined
                 failure is a ``<skipped type="pytest.xfail">`` whose message holds the reason,
                 the tracking link and the failure)
``report.json``  the plugin's JSON report (:func:`write_json_report`, read by :func:`load`)
``summary.md``   :func:`render_markdown` of the JSON report, also appended to
                 ``$GITHUB_STEP_SUMMARY`` when that is set

Nothing here imports pytest at run time: the JSON report is the interface (the plugin's
run state is imported for type checking only).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import os
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import atomic

if TYPE_CHECKING:
    from harness.plugin import HarnessState

__all__ = [
    "OUTCOMES",
    "REPORT_FILES",
    "RunStatus",
    "append_step_summary",
    "load",
    "placeholder_json",
    "placeholder_junit",
    "placeholder_markdown",
    "render_markdown",
    "run_status",
    "tier_counts",
    "write_json_report",
    "write_placeholders",
]

REPORT_FILES = ("junit.xml", "report.json", "summary.md")
JSON_REPORT_VERSION = 1
"""The reports of one ``harness run``, all in its report directory."""


class RunStatus(enum.StrEnum):
    """The verdict of a run, as its reports state it (``status`` in report.json).

    A run's report directory says ABORTED from the moment the run starts: each report is
    replaced by an "aborted" placeholder first, then by the run's real report once pytest has
    finished (PASSED or FAILED). A run that never gets there (Ctrl-C, a start-up or usage
    error, a crash) therefore leaves ABORTED, never the previous run's verdict. SKIPPED is
    for a step that was not run on purpose (``harness ci``'s GPU tier without a GPU).
    """

    PASSED = "passed"
    FAILED = "failed"
    ABORTED = "aborted"
    SKIPPED = "skipped"


OUTCOMES = ("passed", "failed", "error", "skipped", "quarantined", "xfailed", "xpassed")
"""Outcome columns, in the order the summary shows them."""

_GATING = ("failed", "error")


def load(path: Path) -> dict[str, Any]:
    """Read a JSON report, with an error that names the file when it is missing or broken."""
    try:
        data: dict[str, Any] = json.loads(Path(path).read_text())
        return data
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no JSON report; pytest did not get as far as writing one "
            "(see its output above for a usage or collection error)"
        ) from None
    except ValueError as exc:
        raise ValueError(f"{path}: not a valid JSON report ({exc})") from None


def write_json_report(
    path: Path,
    state: HarnessState,
    exit_status: int,
    *,
    over_budget: set[str],
    repro: Callable[[str], str],
    fingerprint: bool = True,
) -> None:
    """Write the machine-readable record of the run (read back by :func:`load`), atomically.

    ``state`` is the plugin's record of the run; ``over_budget`` the node ids over their
    tier's budget; ``repro(nodeid)`` the command that reproduces one test under its seed.
    """
    environment: dict[str, Any] = {}
    if fingerprint:
        try:
            from harness.environment import fingerprint as _fingerprint

            environment = _fingerprint(cwd=state.rootpath)
        except Exception as exc:  # a report without a fingerprint beats no report
            environment = {"error": f"fingerprint failed: {exc}"}
    tiers = {
        name: {
            "description": tier.description,
            "needs": list(tier.needs),
            "budget_s": tier.budget_s,
            "selected": not state.selected or name in state.selected,
            "skipped_reason": state.tier_skips.get(name),
        }
        for name, tier in state.tiers.items()
    }
    report = {
        "version": JSON_REPORT_VERSION,
        "seed": state.seed,
        "seed_source": state.seed_source,
        "deterministic": state.deterministic,
        "ci": state.ci,
        "hypothesis_profile": state.hypothesis_profile,
        "started": dt.datetime.fromtimestamp(state.started, dt.UTC).isoformat(),
        "duration_s": round(time.time() - state.started, 3),
        "exit_status": exit_status,
        "status": str(run_status({"exit_status": exit_status, "interrupted": state.interrupted})),
        "interrupted": state.interrupted,
        "tiers": tiers,
        "quarantine": {
            "path": str(state.quarantine_path),
            "entries": len(state.quarantine),
            "problems": state.quarantine_problems,
        },
        "goldens": [{"nodeid": n, "action": a, "name": g} for n, a, g in state.golden_events],
        "environment": environment,
        "tests": [
            {
                **dataclasses.asdict(r),
                "duration_s": round(r.duration_s, 4),
                "over_budget": r.nodeid in over_budget,
                "repro": repro(r.nodeid)
                if r.outcome in ("failed", "error", "quarantined")
                else None,
            }
            for r in state.records.values()
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, json.dumps(report, indent=2, default=str) + "\n")


def tier_counts(report: Mapping[str, Any]) -> dict[str, Counter[str]]:
    """``{tier: Counter(outcome -> n)}`` in the report's tier order; untiered tests under "-"."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for test in report.get("tests", []):
        counts[test.get("tier") or "-"][test["outcome"]] += 1
    order = [t for t in report.get("tiers", {}) if t in counts] + sorted(
        t for t in counts if t not in report.get("tiers", {})
    )
    return {tier: counts[tier] for tier in order}


def _code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


def _one_line(text: str | None, limit: int = 200) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _passed(report: Mapping[str, Any]) -> bool:
    return run_status(report) is RunStatus.PASSED


def run_status(report: Mapping[str, Any]) -> RunStatus:
    """The verdict of a JSON report: its ``status``, else derived from the exit status."""
    if report.get("status") in set(RunStatus):
        return RunStatus(report["status"])
    if report.get("interrupted"):
        return RunStatus.ABORTED
    return RunStatus.PASSED if report.get("exit_status") == 0 else RunStatus.FAILED


def render_markdown(report: Mapping[str, Any], *, title: str = "ml-harness run") -> str:
    """A GitHub-flavoured markdown summary: verdict, seed, per-tier table, then details."""
    tests = report.get("tests", [])
    verdict = (
        "✅ passed" if _passed(report) else f"❌ failed (exit status {report.get('exit_status')})"
    )
    if report.get("exit_status") == 5:
        verdict = "❌ no tests ran (exit status 5)"
    if run_status(report) is RunStatus.ABORTED:
        verdict = (
            f"❌ aborted (exit status {report.get('exit_status')}): interrupted by Ctrl-C; "
            "the counts below are of the tests that ran before it"
        )
    selected = [n for n, t in report.get("tiers", {}).items() if t.get("selected")]
    seed = report.get("seed")
    lines = [
        f"## {title}: {verdict}",
        "",
        f"Seed {_code(str(seed))} (replay with {_code(f'--harness-seed={seed}')}) · "
        f"deterministic mode {'on' if report.get('deterministic') else 'off'} · "
        f"hypothesis profile {report.get('hypothesis_profile') or '-'} · "
        f"tiers {', '.join(selected) or '-'} · {report.get('duration_s', 0):.1f} s",
        "",
    ]
    counts = tier_counts(report)
    shown = [
        o
        for o in OUTCOMES
        if o in ("passed", "failed", "skipped", "quarantined") or any(c[o] for c in counts.values())
    ]
    lines.append("| tier | " + " | ".join(shown) + " |")
    lines.append("|---" * (len(shown) + 1) + "|")
    for tier, counter in counts.items():
        lines.append(f"| {tier} | " + " | ".join(str(counter[o]) for o in shown) + " |")
    total = sum(counts.values(), Counter())
    lines.append("| **total** | " + " | ".join(f"**{total[o]}**" for o in shown) + " |")
    lines.append("")

    failures = [t for t in tests if t["outcome"] in _GATING]
    if failures:
        lines += ["### Failures", ""]
        for t in failures:
            lines.append(f"- {_code(t['nodeid'])} ({t['outcome']}): {_one_line(t.get('message'))}")
            if t.get("repro"):
                lines.append(f"  - reproduce: {_code(t['repro'])}")
        lines.append("")
    quarantined = [t for t in tests if t["outcome"] == "quarantined"]
    q_passed = [t for t in tests if t.get("quarantine") and t["outcome"] == "passed"]
    if quarantined or q_passed:
        lines += ["### Quarantined (reported, not gating)", ""]
        for t in quarantined:
            q = t["quarantine"]
            lines.append(
                f"- {_code(t['nodeid'])} failed: {_one_line(t.get('message'))}; "
                f"{_one_line(q.get('reason'))} ([tracking]({q.get('issue')}), "
                f"expires {q.get('expires')})"
            )
        for t in q_passed:
            q = t["quarantine"]
            lines.append(
                f"- {_code(t['nodeid'])} passed while quarantined ([tracking]({q.get('issue')})): "
                "remove the entry once it is fixed"
            )
        lines.append("")
    problems = report.get("quarantine", {}).get("problems", [])
    if problems:
        lines += ["### Quarantine problems (these fail the run)", ""]
        lines += [f"- {_one_line(p, 400)}" for p in problems]
        lines.append("")
    skips = Counter(_one_line(t.get("message")) for t in tests if t["outcome"] == "skipped")
    if skips:
        lines += ["### Skipped", ""]
        for reason, n in skips.most_common():
            lines.append(f"- {n} × {reason or '(no reason given)'}")
        lines.append("")
    over = [t for t in tests if t.get("over_budget")]
    if over:
        lines += ["### Over their tier's time budget (reported, not gating)", ""]
        budgets = {n: t.get("budget_s") for n, t in report.get("tiers", {}).items()}
        for t in sorted(over, key=lambda t: -t["duration_s"]):
            lines.append(
                f"- {_code(t['nodeid'])}: {t['duration_s']:.2f} s > {budgets.get(t.get('tier'))} s"
            )
        lines.append("")
    if report.get("goldens"):
        lines += ["### Goldens written (review and commit)", ""]
        lines += [
            f"- {g['action']} {_code(g['name'])} for {_code(g['nodeid'])}"
            for g in report["goldens"]
        ]
        lines.append("")
    env = report.get("environment") or {}
    if env:
        lines += [
            "<details><summary>Environment fingerprint</summary>",
            "",
            "| key | value |",
            "|---|---|",
        ]
        lines += [f"| {k} | {_one_line(str(v), 120)} |" for k, v in env.items()]
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def append_step_summary(markdown: str, env: Mapping[str, str] | None = None) -> Path | None:
    """Append to ``$GITHUB_STEP_SUMMARY`` when it is set; returns the file written, if any."""
    env = os.environ if env is None else env
    target = env.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    with path.open("a", encoding="utf-8") as f:
        f.write(markdown.rstrip("\n") + "\n\n")
    return path


# --------------------------------------------------------------------------------------------
# Placeholders: what a report directory holds while a run is under way, after it was aborted,
# or for a step that was skipped.


def placeholder_json(status: RunStatus, reason: str) -> dict[str, Any]:
    """A JSON report that says ``status`` (aborted or skipped) and why, with no tests."""
    return {
        "version": 1,
        "status": str(status),
        "reason": reason,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "exit_status": None,
        "tiers": {},
        "tests": [],
    }


def placeholder_junit(status: RunStatus, reason: str, *, name: str = "ml-harness") -> str:
    """A JUnit XML report of one test case that errored (aborted) or was skipped, so a CI
    system reading it shows that instead of a pass (or of nothing at all)."""
    suites = ET.Element("testsuites")
    aborted = status is RunStatus.ABORTED
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=name,
        tests="1",
        errors="1" if aborted else "0",
        failures="0",
        skipped="0" if aborted else "1",
    )
    case = ET.SubElement(suite, "testcase", classname="harness", name=f"run {status}")
    child = ET.SubElement(case, "error" if aborted else "skipped", message=f"{status}: {reason}")
    child.text = reason
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def placeholder_markdown(status: RunStatus, reason: str, *, title: str = "ml-harness run") -> str:
    icon = "❌" if status is RunStatus.ABORTED else "⏭️"
    return f"## {title}: {icon} {status}\n\n{reason}\n"


def write_placeholders(
    report_dir: Path, status: RunStatus, reason: str, *, title: str = "ml-harness run"
) -> None:
    """Replace every report of a run in ``report_dir`` (``REPORT_FILES``) with one that says
    ``status`` and ``reason``, each atomically."""
    atomic.write_text(report_dir / "junit.xml", placeholder_junit(status, reason, name=title))
    atomic.write_text(
        report_dir / "report.json", json.dumps(placeholder_json(status, reason), indent=2) + "\n"
    )
    atomic.write_text(report_dir / "summary.md", placeholder_markdown(status, reason, title=title))
