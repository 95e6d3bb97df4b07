"""Merging the reports of a sharded run into one summary and one gate decision.

Each shard (``harness run --shard K/N``) writes ``junit.xml``, ``report.json`` (with a
``"shard"`` record: K, N, the whole collection, see :mod:`harness.shards`) and ``summary.md``
into its own folder. :func:`merge` reads those folders and decides, in this order of
suspicion, what the CI page shows and whether the run passes:

1. Every shard 1..N is present exactly once, with a readable ``report.json`` and
   ``junit.xml``, a shard record, and an exit status that means pytest ran to the end
   (0, 1, or 5 for a shard whose part of the split is empty). A missing shard is never a
   smaller passing run: it fails the merge.
2. The shards agree on N, on the seed, and on the collection (same digest), so they are parts
   of one run.
3. The tests the shards ran add up to the collection: none missing, none run twice, none
   from outside it; and each shard's junit.xml does not show failures its report.json lacks.
4. The shards come from one CI run (GitHub's run id, when recorded) and one attempt of it: a
   shard from a later attempt than the others is a re-run that may hide a failure, and fails
   the gate (:func:`_origins`).
5. Then the gate itself, with the same semantics as one unsharded run: a failed or erroring
   test in any shard fails it, and so does a shard whose pytest exited 1 for a reason no test
   record shows; quarantined failures are reported and do not gate; quarantine problems
   (expired or stale entries) fail it; nothing run at all fails it.

Nothing here imports pytest: the JSON reports are the interface.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import atomic
from harness import history as _history
from harness import report as _report
from harness import shards as _shards

__all__ = ["MergeResult", "ShardReport", "merge", "write"]

_RAN_TO_THE_END = (0, 1, 5)
"""pytest exit statuses of a shard that ran its part: passed, tests failed, nothing in it."""

_JUNIT_TOTALS = ("tests", "failures", "errors", "skipped")

_OUTCOMES = frozenset(("passed", "failed", "error", "skipped", "xfailed", "xpassed", "quarantined"))
"""Every outcome the plugin writes; any other value in a shard's report is not trusted."""
_GATING = ("failed", "error")
_GATING_JUNIT = ("failures", "errors")


@dataclasses.dataclass
class ShardReport:
    """One shard's folder as read from disk."""

    folder: Path
    report: dict[str, Any] | None = None
    junit: ET.Element | None = None
    summary: str = ""
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def record(self) -> dict[str, Any]:
        return (self.report or {}).get("shard") or {}

    @property
    def label(self) -> str:
        rec = self.record
        return f"shard {rec['index']}/{rec['total']}" if rec else str(self.folder)


@dataclasses.dataclass
class MergeResult:
    """The merged run: ``passed`` is the one gate decision."""

    passed: bool
    problems: list[str]
    """Why the shards do not add up to one whole run (each one fails the merge)."""
    report: dict[str, Any]
    """A JSON report in the shape :func:`harness.report.render_markdown` reads, plus
    ``"shards"`` (one row per shard) and ``"merge_problems"``."""
    junit: ET.Element
    markdown: str
    shards: list[ShardReport]


def _read(folder: Path) -> ShardReport:
    shard = ShardReport(folder=folder)
    if not folder.is_dir():
        shard.problems.append(f"{folder}: no such folder (the shard's reports never arrived)")
        return shard
    try:
        shard.report = _report.load(folder / "report.json")
    except (FileNotFoundError, ValueError) as exc:
        shard.problems.append(str(exc))
    if shard.report is not None and not isinstance(shard.report, dict):
        shard.problems.append(
            f"{folder / 'report.json'}: not a JSON report (a {type(shard.report).__name__}, "
            "not an object); produce it again by running every shard (`harness run --shard "
            "K/N`), not this one alone"
        )
        shard.report = None
    try:
        root = ET.parse(folder / "junit.xml").getroot()
        if root.tag not in ("testsuites", "testsuite"):
            shard.problems.append(
                f"{folder / 'junit.xml'}: not a JUnit report (root element <{root.tag}>)"
            )
        else:
            shard.junit = root
    except FileNotFoundError:
        shard.problems.append(f"{folder / 'junit.xml'}: missing")
    except ET.ParseError as exc:
        shard.problems.append(f"{folder / 'junit.xml'}: not valid XML ({exc})")
    summary = folder / "summary.md"
    shard.summary = summary.read_text() if summary.is_file() else ""
    if shard.report is not None:
        rec = shard.report.get("shard")
        if not rec:
            shard.problems.append(
                f"{folder / 'report.json'}: not a shard's report (no shard record); "
                "run each shard with `harness run --shard K/N`"
            )
        elif not _valid_position(rec):
            # Checked before anything counts 1..N: a total of 10**10 would build that list.
            said = f"{rec.get('index')!r} of {rec.get('total')!r}" if isinstance(rec, dict) else rec
            shard.problems.append(
                f"{folder / 'report.json'}: its shard record says shard {said!r}, not K of N "
                f"with 1 <= K <= N <= {_shards.MAX_SHARDS}; produce it again by running every "
                "shard (`harness run --shard K/N`), not this one alone"
            )
            shard.report["shard"] = None
        elif rec.get("collected") is None:
            shard.problems.append(
                f"{folder}: {shard.label} recorded no collection (pytest stopped before collecting)"
            )
        status = shard.report.get("exit_status")
        if _report.run_status(shard.report) is _report.RunStatus.ABORTED:
            shard.problems.append(
                f"{folder}: the shard's run was aborted"
                + (f" ({shard.report['reason']})" if shard.report.get("reason") else "")
            )
        elif status not in _RAN_TO_THE_END:
            shard.problems.append(
                f"{folder}: {shard.label} did not run to the end (pytest exit status {status})"
            )
        shard.problems += _inconsistencies(shard)
    return shard


def _valid_position(rec: Any) -> bool:
    """Whether a shard record's index and total are K of N as ``Shard`` accepts them."""
    if not isinstance(rec, dict):
        return False
    k, n = rec.get("index"), rec.get("total")
    if (
        not (isinstance(k, int) and isinstance(n, int))
        or isinstance(k, bool)
        or isinstance(n, bool)
    ):
        return False
    try:
        _shards.Shard(index=k, total=n)
    except _shards.ShardError:
        return False
    return True


def _suites(junit: ET.Element) -> list[ET.Element]:
    return [junit] if junit.tag == "testsuite" else junit.findall("testsuite")


def _inconsistencies(shard: ShardReport) -> list[str]:
    """Where a shard's own files contradict each other: the merge cannot tell which is true.

    The gate reads report.json; the CI page shows junit.xml. A report.json that lists no
    failing test beside a junit.xml with failures (files from two runs in one folder, or an
    edited report) would otherwise pass a run whose page shows it red.
    """
    report = shard.report or {}
    tests = report.get("tests", [])
    if not isinstance(tests, list) or not all(
        isinstance(t, dict) and isinstance(t.get("nodeid"), str) for t in tests
    ):
        report["tests"] = []  # the problem fails the merge; nothing below can read them
        return [f"{shard.folder / 'report.json'}: its 'tests' is not a list of test records"]
    odd = sorted({str(t.get("outcome")) for t in tests} - _OUTCOMES)
    problems = []
    if odd:
        problems.append(
            f"{shard.folder / 'report.json'}: unknown test outcome(s) {', '.join(odd)} "
            f"(expected one of {', '.join(sorted(_OUTCOMES))})"
        )
    if shard.junit is not None and not any(t.get("outcome") in _GATING for t in tests):
        try:
            bad = sum(int(suite.get(k, 0)) for suite in _suites(shard.junit) for k in _GATING_JUNIT)
        except ValueError as exc:
            return [*problems, f"{shard.folder / 'junit.xml'}: a total is not a number ({exc})"]
        if bad:
            problems.append(
                f"{shard.folder}: junit.xml counts {bad} failure(s)/error(s) but report.json "
                "lists no failed test: the two files are not from the same run"
            )
    return problems


def _check_whole(shards: list[ShardReport], expect: int | None) -> list[str]:
    """Steps 1-3 of the module docstring; every problem found, not just the first."""
    problems = [p for s in shards for p in s.problems]
    recorded = [s for s in shards if s.record]
    totals = sorted({s.record["total"] for s in recorded})
    if expect is not None and totals and totals != [expect]:
        problems.append(
            f"expected {expect} shards, but the shards' reports say {', '.join(map(str, totals))}"
        )
    if len(totals) > 1:
        problems.append(f"the shards disagree on the shard count: {totals}")
    total = expect if expect is not None else (totals[0] if totals else None)
    if total is None:
        problems.append("no shard report could be read: nothing to merge")
        return problems
    seen = Counter(s.record["index"] for s in recorded)
    missing = [k for k in range(1, total + 1) if k not in seen]
    if missing:
        problems.append(
            f"missing shard(s) {', '.join(f'{k}/{total}' for k in missing)}: a merge without "
            "them would pass tests that never ran"
        )
    twice = sorted(k for k, n in seen.items() if n > 1)
    if twice:
        problems.append(f"shard(s) {twice} given more than once")
    seeds = sorted({str(s.report.get("seed")) for s in recorded if s.report})
    if len(seeds) > 1:
        problems.append(
            f"the shards ran under different seeds ({', '.join(seeds)}): pass every shard "
            "the same --seed, so that one seed replays the whole run"
        )
    digests = {s.record.get("digest") for s in recorded if s.record.get("collected") is not None}
    if len(digests) > 1:
        problems.append(
            "the shards collected different tests (different commits or options?): "
            + "; ".join(f"{s.label}: {len(s.record['collected'])} tests" for s in recorded)
        )
    elif digests and not missing:
        # One digest: every shard's list is the same (an empty collection included).
        collected = set(recorded[0].record["collected"] or ())
        ran = Counter(t["nodeid"] for s in recorded for t in (s.report or {}).get("tests", []))
        absent = sorted(collected - set(ran))
        if absent:
            problems.append(
                f"{len(absent)} collected test(s) ran in no shard, e.g. {', '.join(absent[:5])}"
            )
        foreign = sorted(set(ran) - collected)
        if foreign:
            problems.append(
                f"{len(foreign)} test(s) ran that the shards did not collect, e.g. "
                f"{', '.join(foreign[:5])}"
            )
        dup = sorted(n for n, c in ran.items() if c > 1)
        if dup:
            problems.append(f"{len(dup)} test(s) ran in more than one shard: {dup[:5]}")
    return problems


def _origins(recorded: list[ShardReport]) -> tuple[list[str], list[str], list[str]]:
    """(problems, reruns, notes) from where each shard came from (its CI run and attempt).

    problems (exit 2): shards of different workflow runs, or some with a run id and some
    without, or an attempt that is not a number: not parts of one run.
    reruns (exit 1): within one run, shards from a later attempt than others. GitHub re-runs
    a failed shard job under the same seed and collection, so a green re-run would hide the
    first attempt's failure from the merge: the retry the quarantine design forbids.
    notes (loud, not failing): every shard from the same attempt > 1: the whole run was
    re-run, which is a new run of the same commit, as a new push would be (docs/harness.md,
    "Re-run shards").
    """
    rows = []
    for s in recorded:
        o = s.record.get("origin") or {}
        run_id = o.get("run_id") if isinstance(o, dict) else None
        attempt = o.get("run_attempt") if isinstance(o, dict) else None
        rows.append((s, None if run_id is None else str(run_id), attempt))
    run_ids = sorted({r for _, r, _ in rows}, key=str)
    if len(run_ids) > 1:
        named = "; ".join(
            f"{s.label} from {f'run {r}' if r else 'no CI run (no GITHUB_RUN_ID: a local run)'}"
            for s, r, _ in rows
        )
        return (
            [
                f"the shards come from different workflow runs ({named}): merge the shards of "
                "one run only"
            ],
            [],
            [],
        )
    if not rows or run_ids == [None]:
        return [], [], []  # local runs: no attempts to compare
    run_id = run_ids[0]
    attempts: list[tuple[ShardReport, int]] = []
    problems = []
    for s, _, attempt in rows:
        text = str(attempt) if attempt is not None else ""
        if not (text.isascii() and text.isdigit() and int(text) >= 1):
            problems.append(
                f"{s.label} of run {run_id} records run attempt {attempt!r}, not a number >= 1 "
                "(GITHUB_RUN_ATTEMPT): the merge cannot tell whether it is a re-run"
            )
        else:
            attempts.append((s, int(text)))
    if problems or not attempts:
        return problems, [], []
    first = min(a for _, a in attempts)
    last = max(a for _, a in attempts)
    if first != last:
        earliest = ", ".join(s.label for s, a in attempts if a == first)
        reruns = [
            f"{s.label} is from attempt {a} of run {run_id} ({earliest} from attempt {first}): "
            "an earlier attempt of it may have failed, and a green re-run does not undo that; "
            "look at that attempt's failure: put a flaky test in quarantine.toml (with a "
            "reason and a link), fix a broken one, then push (or re-run all jobs) so that "
            "every shard is from one attempt"
            for s, a in attempts
            if a != first
        ]
        return [], reruns, []
    if first > 1:
        return (
            [],
            [],
            [
                f"every shard is from attempt {first} of run {run_id}: the whole run was re-run; "
                "an earlier attempt may have failed: look at it before trusting this green"
            ],
        )
    return [], [], []


def _merged_junit(shards: list[ShardReport]) -> ET.Element:
    root = ET.Element("testsuites", {"name": "ml-harness (merged shards)"})
    totals: Counter[str] = Counter()
    seconds = 0.0
    for shard in shards:
        if shard.junit is None:
            continue
        for suite in _suites(shard.junit):
            suite.set("name", f"{suite.get('name', 'pytest')} ({shard.label})")
            for key in _JUNIT_TOTALS:
                with contextlib.suppress(ValueError):  # reported by _inconsistencies
                    totals[key] += int(suite.get(key, 0))
            seconds += float(suite.get("time", 0.0))
            root.append(suite)
    for key in _JUNIT_TOTALS:
        root.set(key, str(totals[key]))
    root.set("time", f"{seconds:.3f}")
    return root


def merge(folders: Sequence[Path], *, expect: int | None = None) -> MergeResult:
    """Read every shard folder and merge them (module docstring: what fails the merge)."""
    shards = [_read(Path(f)) for f in folders]
    shards.sort(key=lambda s: (s.record.get("index", 0), str(s.folder)))
    problems = _check_whole(shards, expect)
    origin_problems, reruns, rerun_notes = _origins([s for s in shards if s.record])
    problems += origin_problems
    good = [s for s in shards if s.report is not None]
    first: dict[str, Any] = (good[0].report or {}) if good else {}
    tests = [t for s in good for t in (s.report or {}).get("tests", [])]
    quarantine_problems = list(
        dict.fromkeys(
            p for s in good for p in (s.report or {}).get("quarantine", {}).get("problems", [])
        )
    )
    gating = [t for t in tests if t.get("outcome") in _GATING]
    # A shard whose pytest said "failed" fails the merge even when its report names no failed
    # test (a test that called pytest.exit(returncode=1), a plugin that failed the session):
    # the unsharded run would have exited 1 too.
    failed_shards = [s for s in good if (s.report or {}).get("exit_status") == 1]
    if problems:
        exit_status = 2
    elif gating or quarantine_problems or failed_shards or reruns:
        exit_status = 1
    elif not tests:
        exit_status = 5
    else:
        exit_status = 0
    report: dict[str, Any] = {
        # The shards' own verdicts (status, reason) are not the merged run's.
        **{k: v for k, v in first.items() if k not in ("tests", "shard", "status", "reason")},
        "exit_status": exit_status,
        "status": str(_report.RunStatus.PASSED if exit_status == 0 else _report.RunStatus.FAILED),
        # The shards ran side by side: the run took as long as its slowest shard.
        "duration_s": max((s.report or {}).get("duration_s", 0.0) for s in good) if good else 0.0,
        "quarantine": {
            **first.get("quarantine", {}),
            "problems": quarantine_problems,
        },
        "goldens": [g for s in good for g in (s.report or {}).get("goldens", [])],
        "tests": tests,
        "merge_problems": problems,
        "shards": [
            {
                "folder": str(s.folder),
                "index": s.record.get("index"),
                "total": s.record.get("total"),
                "exit_status": (s.report or {}).get("exit_status"),
                "tests": len((s.report or {}).get("tests", [])),
                "duration_s": (s.report or {}).get("duration_s"),
                "origin": s.record.get("origin"),
                "problems": s.problems,
            }
            for s in shards
        ],
    }
    passed = exit_status == 0
    silent = [
        f"{s.label} exited 1 (failed) although its report lists no failed test; its own "
        "summary and log say why"
        for s in failed_shards
        if not any(t.get("outcome") in _GATING for t in (s.report or {}).get("tests", []))
        and not (s.report or {}).get("quarantine", {}).get("problems")
    ]
    report["failed_shards"] = silent
    report["reruns"] = reruns
    report["rerun_notes"] = rerun_notes
    markdown = _markdown(report, shards, problems, silent)
    return MergeResult(passed, problems, report, _merged_junit(shards), markdown, shards)


def _markdown(
    report: dict[str, Any], shards: list[ShardReport], problems: list[str], silent: list[str]
) -> str:
    n = len([s for s in shards if s.record])
    lines = [f"- ❌ re-run: {line}" for line in report["reruns"]]
    lines += [f"- ⚠️ re-run: {line}" for line in report["rerun_notes"]]
    if lines:
        lines.append("")
    if silent:
        lines += [f"- ❌ {line}" for line in silent] + [""]
    if problems:
        lines += [
            f"## ml-harness merged shards: ❌ incomplete ({len(problems)} problem(s)); "
            "the merge fails",
            "",
        ]
        lines += [f"- {' '.join(p.split())}" for p in problems]
        lines.append("")
    lines.append(_report.render_markdown(report, title=f"ml-harness merged run ({n} shard(s))"))
    lines += [
        "### Shards",
        "",
        "| shard | exit status | tests | time | folder |",
        "|---|---|---|---|---|",
    ]
    for row in report["shards"]:
        where = f"{row['index']}/{row['total']}" if row["index"] else "?"
        time_s = f"{row['duration_s']:.1f} s" if row["duration_s"] is not None else "-"
        lines.append(
            f"| {where} | {row['exit_status']} | {row['tests']} | {time_s} | `{row['folder']}` |"
        )
    lines.append("")
    for shard in shards:
        if shard.summary:
            lines += [
                f"<details><summary>{shard.label}: its own summary</summary>",
                "",
                shard.summary.strip(),
                "",
                "</details>",
                "",
            ]
    return "\n".join(lines)


def write(result: MergeResult, out: Path) -> list[Path]:
    """Write junit.xml, report.json and summary.md of the merged run to ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        out / "junit.xml": ET.tostring(result.junit, encoding="unicode", xml_declaration=True),
        out / "report.json": json.dumps(result.report, indent=2, default=str) + "\n",
        out / "summary.md": result.markdown.rstrip("\n") + "\n",
    }
    for path, text in files.items():
        atomic.write_text(path, text)
    # Test history: appended only when $HARNESS_HISTORY_DB is set; a failure is one warning
    # line, never a change to the merge's verdict.
    _history.record_run(result.report, out / "report.json")
    return list(files)
