"""`harness history`: import reports into the test history, score flakiness, propose
quarantine edits. A thin layer over ``harness.history`` (every rule lives there)."""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from harness import quarantine as q
from harness.cli.errors import UsageProblem
from harness.history import ENV_VAR, HistoryError
from harness.history import scores as sc

_db_option = click.option(
    "--db",
    envvar=ENV_VAR,
    metavar="URL",
    help=f"History database: a SQLite file path or postgresql://USER@HOST:PORT/DB "
    f"[default: ${ENV_VAR}].",
)
_min_runs_option = click.option(
    "--min-runs",
    type=click.IntRange(1),
    default=sc.DEFAULT_MIN_RUNS,
    show_default=True,
    help="Runs with an outcome below which a test without decisive evidence is 'insufficient'.",
)


def _open(db: str | None, *, create: bool = True) -> Any:
    """The store at ``db``; ``create=False`` for the commands that only read it (a mistyped
    path is refused, not answered with an empty history in a new file)."""
    if not db:
        raise UsageProblem(f"no history database: pass --db PATH_OR_URL or set ${ENV_VAR}")
    from harness.history.store import open_store

    try:
        return open_store(db, create=create)
    except HistoryError as exc:
        raise UsageProblem(str(exc)) from None


@contextlib.contextmanager
def _reading(store: Any) -> Iterator[Any]:
    """The store, closed after use; a database that fails mid-command (a server gone, a
    lock held past the busy timeout, a damaged file) is one line naming it, not a traceback."""
    import sqlalchemy as sa

    from harness.history.store import database_problem

    with store:
        try:
            yield store
        except sa.exc.SQLAlchemyError as exc:
            raise click.ClickException(
                f"history database {store.url}: {database_problem(exc)}"
            ) from None


@click.group(name="history")
def history() -> None:
    """Test history: every run's outcomes kept, flakiness scored from them.

    `harness run`, `harness ci` and `harness report merge` append their report when
    $HARNESS_HISTORY_DB names a database (a SQLite file, or postgresql://... for a team).

    \b
    Examples:
      harness history import reports/junit.xml ci-artifacts/*/report.json
      harness history flaky --window 50
      harness history flaky --propose --issue https://github.com/ORG/REPO/issues/123
    """


@history.command(name="import")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@_db_option
@click.option("--commit", help="The git commit the reports ran (JUnit files do not say).")
@click.option("--runner", help="The machine the reports ran on.")
@click.option("--tree", help="The git tree the reports ran (default: the commit's, when known).")
def import_(
    files: tuple[Path, ...],
    db: str | None,
    commit: str | None,
    runner: str | None,
    tree: str | None,
) -> None:
    """Append FILES to the history: harness report.json files or JUnit XML files of any tool.

    A file already imported is not added twice. Every file is read before anything is
    written: one bad file adds nothing.
    """
    from harness.history.ingest import from_file

    try:
        records = [from_file(f, commit=commit, runner=runner, tree=tree) for f in files]
    except HistoryError as exc:
        raise UsageProblem(str(exc)) from None
    with _reading(_open(db)) as store:
        for path, record in zip(files, records, strict=True):
            if record.status in ("aborted", "skipped"):
                # A placeholder report (the run was interrupted, or the step was not run)
                # holds no outcomes; CI artifacts often include one, so it is not an error.
                click.echo(f"{path}: skipped: the report says the run was {record.status}")
                continue
            added = store.append(record)
            what = f"{len(record.results)} result(s)"
            click.echo(f"{path}: {'appended ' + what if added else 'already in the history'}")


def _quote(text: str) -> str:
    return shlex.quote(text)


@history.command()
@_db_option
@click.option(
    "--window",
    type=click.IntRange(1),
    default=50,
    show_default=True,
    help="Score over the last N runs.",
)
@_min_runs_option
@click.option(
    "--confidence",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=sc.DEFAULT_CONFIDENCE,
    show_default=True,
    help="Confidence that an un-quarantined test no longer fails at its observed rate.",
)
@click.option("--all", "show_all", is_flag=True, help="List healthy and insufficient tests too.")
@click.option("--json", "as_json", is_flag=True, help="Print the scores as JSON.")
@click.option(
    "--propose",
    is_flag=True,
    help="Print the `harness quarantine add/remove` commands the evidence supports.",
)
@click.option(
    "--issue",
    metavar="URL",
    default="ISSUE_URL",
    help="Tracking issue for proposed quarantines [default: a placeholder to fill in].",
)
@click.option(
    "--quarantine-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=q.FILENAME,
    show_default=True,
    help="The quarantine file (which tests are quarantined now).",
)
def flaky(
    db: str | None,
    window: int,
    min_runs: int,
    confidence: float,
    show_all: bool,
    as_json: bool,
    propose: bool,
    issue: str,
    quarantine_file: Path,
) -> None:
    """Score every test over the last runs: broken, seed-dependent, flaky, healthy, or
    insufficient (too little history), most disruptive first, with the evidence."""
    try:
        entries = q.load(quarantine_file)
    except (q.QuarantineError, OSError) as exc:
        raise UsageProblem(str(exc)) from None
    with _reading(_open(db, create=False)) as store:
        # Scored from counts aggregated in SQL where a test's counts decide it (it did not
        # fail in the window), from its outcomes otherwise: the same scores, without reading
        # every outcome of every run (Store.scores).
        scores = sorted(store.scores(window, min_runs=min_runs), key=sc.Score.sort_key)
        quarantined = {s.nodeid: e for s in scores if (e := q.find(entries, s.nodeid))}
        full = store.observations(None, tests=quarantined) if quarantined else {}
        runs = store.run_count()
    lifts = _lifts(entries, quarantined, full, confidence)
    if as_json:
        click.echo(json.dumps(_as_json(scores, lifts, window, runs), indent=2))
        return
    if propose:
        _print_proposals(scores, quarantined, lifts, issue)
        return
    _print_table(scores, show_all, window, runs)


def _lifts(
    entries: list[q.Entry],
    quarantined: dict[str, q.Entry],
    full: dict[str, Any],
    confidence: float,
) -> dict[str, tuple[bool, list[str]]]:
    """Per quarantine entry with history: (due, evidence). An entry covering several
    parametrizations is due only when every one of them is."""
    out: dict[str, tuple[bool, list[str]]] = {}
    for entry in entries:
        ids = [n for n, e in quarantined.items() if e is entry]
        if not ids:
            continue
        due_all = True
        notes = []
        for nodeid in ids:
            due, streak, needed, p = sc.unquarantine_due(full.get(nodeid, []), confidence)
            due_all = due_all and due
            notes.append(
                f"{nodeid}: passed {streak} run(s) in a row; {needed} needed "
                f"(p = {p:.1%}, C = {confidence:.0%})"
            )
        out[entry.test] = (due_all, notes)
    return out


def _as_json(
    scores: list[sc.Score], lifts: dict[str, tuple[bool, list[str]]], window: int, runs: int
) -> dict[str, Any]:
    return {
        "window": window,
        "runs_in_history": runs,
        "tests": [
            {
                "nodeid": s.nodeid,
                "verdict": str(s.verdict),
                "runs": s.runs,
                "failures": s.failures,
                "failure_rate": round(s.failure_rate, 4),
                "flip_rate": round(s.flip_rate, 4),
                "same_tree_events": s.same_tree_events,
                "same_seed_events": s.same_seed_events,
                "failing_seeds": s.failing_seeds,
                "pass_streak": s.pass_streak,
                "strip": s.strip,
                "evidence": s.evidence,
            }
            for s in scores
        ],
        "unquarantine": [
            {"test": test, "due": due, "evidence": notes} for test, (due, notes) in lifts.items()
        ],
    }


def _print_proposals(
    scores: list[sc.Score],
    quarantined: dict[str, q.Entry],
    lifts: dict[str, tuple[bool, list[str]]],
    issue: str,
) -> None:
    proposed = 0
    for s in scores:
        if s.verdict is not sc.Verdict.FLAKY or s.nodeid in quarantined:
            continue
        reason = "history: " + "; ".join(s.evidence)
        click.echo(
            f"harness quarantine add {_quote(s.nodeid)} --reason {_quote(reason)} "
            f"--issue {_quote(issue)}"
        )
        proposed += 1
    for test, (due, notes) in lifts.items():
        if due:
            for note in notes:
                click.echo(f"# {note}")
            click.echo(f"harness quarantine remove {_quote(test)}")
            proposed += 1
        else:
            for note in notes:
                click.echo(f"# keep quarantined: {note}")
    if not proposed:
        click.echo("# nothing to propose: no new flaky test, no quarantine due to be lifted")


def _print_table(scores: list[sc.Score], show_all: bool, window: int, runs: int) -> None:
    if not runs:
        click.echo(
            "the history holds no runs yet: harness run appends one when HARNESS_HISTORY_DB "
            "names it; harness history import adds reports made elsewhere"
        )
        return
    counts = {v: sum(s.verdict is v for s in scores) for v in sc.Verdict}
    click.echo(
        f"{len(scores)} test(s) over the last {min(window, runs)} of {runs} run(s): "
        + ", ".join(f"{n} {v}" for v, n in counts.items())
    )
    shown = [
        s
        for s in scores
        if show_all or s.verdict not in (sc.Verdict.HEALTHY, sc.Verdict.INSUFFICIENT)
    ]
    for s in shown:
        click.echo(
            f"{s.verdict:<15} {s.failures:>4}/{s.runs:<4} flips {s.flip_rate:4.0%}  {s.nodeid}"
        )
        click.echo(f"{'':16}{'; '.join(s.evidence)}")


@history.command()
@_db_option
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("reports/history/tests.html"),
    show_default=True,
    help="The page to write.",
)
@click.option(
    "--window",
    type=click.IntRange(1),
    default=50,
    show_default=True,
    help="Show and score the last N runs.",
)
@_min_runs_option
def page(db: str | None, out: Path, window: int, min_runs: int) -> None:
    """Write the tests page: a row per test with its verdict, outcome strip, rates, median
    duration and the command that replays its last failure (one HTML file, no script)."""
    from harness import atomic
    from harness.history import page as _page

    with _reading(_open(db, create=False)) as store:
        observed = store.observations(window)
        runs = store.run_count()
    if not runs:
        click.echo(f"note: the history {store.url} holds no runs yet: the page lists no test")
    scores = sorted(
        (sc.score(n, obs, min_runs=min_runs) for n, obs in observed.items()),
        key=sc.Score.sort_key,
    )
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_text(out, _page.render(scores, observed, window=window, runs=runs))
    except OSError as exc:
        raise UsageProblem(f"{out}: cannot write the page ({exc.strerror or exc})") from None
    click.echo(f"{out}: {len(scores)} test(s) over the last {min(window, runs)} run(s)")
