"""`harness history` from the outside (click's runner; `harness run` as a subprocess), and
the store on PostgreSQL."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from harness.cli import main
from harness.history import ENV_VAR, record_run
from harness.history import scores as sc
from harness.history.records import RunRecord, TestResult
from harness.history.store import HEAD, head_revision, normalize_url, open_store

OTHER_TOOL_JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="jest" tests="4" timestamp="2026-11-30T10:00:00">
  <testcase classname="api.users" name="creates a user" time="0.12"/>
  <testcase classname="api.users" name="deletes a user" time="0.30">
    <failure message="expected 204">stack</failure>
  </testcase>
  <testcase classname="api.users" name="lists users" time="0.01"><error message="boom"/></testcase>
  <testcase classname="api.users" name="pages users"><skipped/></testcase>
</testsuite>
"""


def _invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    # The outer run's history and runner name (a CI runner sets RUNNER_NAME) never leak in.
    clean: dict[str, str | None] = {ENV_VAR: None, "HARNESS_RUNNER": None, "RUNNER_NAME": None}
    result = CliRunner().invoke(main, list(args), env={**clean, **(env or {})})
    return result.exit_code, result.output


def _run(key: str, when: float, outcomes: dict[str, str], *, tree: str, seed: int = 1) -> RunRecord:
    return RunRecord(
        run_key=key,
        started_at=when,
        source="harness",
        results=[TestResult(n, o, 0.1, seed) for n, o in outcomes.items()],
        commit="c" + tree,
        tree=tree,
        runner="cpu-1",
    )


def test_a_junit_file_from_another_tool_is_imported_once(tmp_path: Path) -> None:
    junit = tmp_path / "jest.xml"
    junit.write_text(OTHER_TOOL_JUNIT)
    db = str(tmp_path / "h.db")
    code, out = _invoke("history", "import", str(junit), "--db", db, "--commit", "abc")
    assert (code, out.strip()) == (0, f"{junit}: appended 4 result(s)")
    code, out = _invoke("history", "import", str(junit), "--db", db)
    assert code == 0 and "already in the history" in out
    with open_store(db) as store:
        observed = store.observations(None)
    outcomes = {n: [o.outcome for o in obs] for n, obs in observed.items()}
    assert outcomes == {
        "api.users::creates a user": ["passed"],
        "api.users::deletes a user": ["failed"],
        "api.users::lists users": ["error"],
        "api.users::pages users": ["skipped"],
    }
    assert {o.seed for obs in observed.values() for o in obs} == {None}


def test_harness_reports_are_imported_and_an_aborted_one_is_skipped(tmp_path: Path) -> None:
    from harness import report as _report

    finished = tmp_path / "a" / "report.json"
    aborted = tmp_path / "b" / "report.json"
    for path in (finished, aborted):
        path.parent.mkdir()
    finished.write_text(
        json.dumps(
            {
                "started": "2026-12-01T10:00:00+00:00",
                "seed": 42,
                "status": "failed",
                "environment": {"git_commit": None, "hostname": "box"},
                "tests": [
                    {"nodeid": "t.py::a", "outcome": "failed", "duration_s": 0.5, "seed": 7},
                    {"nodeid": "t.py::b", "outcome": "quarantined", "seed": 8},
                ],
            }
        )
    )
    aborted.write_text(json.dumps(_report.placeholder_json(_report.RunStatus.ABORTED, "Ctrl-C")))
    db = str(tmp_path / "h.db")
    code, out = _invoke("history", "import", str(finished), str(aborted), "--db", db)
    assert code == 0
    assert out.splitlines() == [
        f"{finished}: appended 2 result(s)",
        f"{aborted}: skipped: the report says the run was aborted",
    ]
    with open_store(db) as store:
        observed = store.observations(None)
    assert [(o.outcome, o.seed, o.run_seed, o.runner) for o in observed["t.py::a"]] == [
        ("failed", 7, 42, "box")
    ]


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ("<testsuite><testcase name='x'>", "not well-formed XML"),
        ("<html><body/></html>", "not a JUnit report (root element <html>"),
        ("<testsuite><testcase classname='a'/></testsuite>", "a <testcase> without a name"),
    ],
)
def test_a_malformed_junit_file_is_refused_by_name_and_nothing_is_imported(
    tmp_path: Path, content: str, complaint: str
) -> None:
    good, bad = tmp_path / "good.xml", tmp_path / "bad.xml"
    good.write_text(OTHER_TOOL_JUNIT)
    bad.write_text(content)
    db = tmp_path / "h.db"
    code, out = _invoke("history", "import", str(good), str(bad), "--db", str(db))
    assert code == 2
    assert f"{bad}: {complaint}" in out
    assert "Traceback" not in out
    assert not db.exists()


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--db", "mysql://u@h/db"], "unsupported history database URL 'mysql://u@h/db'"),
        ([], f"no history database: pass --db PATH_OR_URL or set ${ENV_VAR}"),
        (["--db", "x.db", "--window", "0"], "'--window': 0 is not in the range"),
        (["--db", "x.db", "--confidence", "1"], "'--confidence': 1"),
    ],
)
def test_bad_history_options_are_refused_with_the_value_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], complaint: str
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out = _invoke("history", "flaky", *args)
    assert code == 2, out
    assert complaint in out


@pytest.fixture
def mixed_history(tmp_path: Path) -> str:
    """12 runs: a broken test, a flake (pass and fail on one tree), a healthy test."""
    db = str(tmp_path / "h.db")
    with open_store(db) as store:
        for r in range(12):
            store.append(
                _run(
                    f"r{r}",
                    1000.0 + r,
                    {
                        "t.py::test_broken": "failed" if r >= 6 else "passed",
                        "t.py::test_flaky": "failed" if r in (3, 8) else "passed",
                        "t.py::test_fine": "passed",
                    },
                    tree=f"{r // 2:040x}",
                    seed=r,
                )
            )
    return db


def test_flaky_lists_the_disruptive_tests_first_with_their_evidence(
    mixed_history: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out = _invoke("history", "flaky", "--db", mixed_history)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        "3 test(s) over the last 12 of 12 run(s): 1 broken, 0 seed-dependent, 1 flaky, "
        "1 healthy, 0 insufficient"
    )
    assert lines[1].split() == ["broken", "6/12", "flips", "9%", "t.py::test_broken"]
    assert lines[3].split()[0::4] == ["flaky", "t.py::test_flaky"]
    assert "passed and failed on 2 identical git tree(s)" in lines[4]
    assert "t.py::test_fine" not in out

    code, out = _invoke("history", "flaky", "--db", mixed_history, "--json")
    report = json.loads(out)
    fine = next(t for t in report["tests"] if t["nodeid"] == "t.py::test_fine")
    assert (fine["verdict"], fine["strip"]) == ("healthy", "P" * 12)


def test_propose_quarantines_the_flaky_test_only(
    mixed_history: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out = _invoke(
        "history", "flaky", "--db", mixed_history, "--propose", "--issue", "https://x/1"
    )
    assert code == 0
    (line,) = out.splitlines()
    argv = shlex.split(line)
    assert argv[:4] == ["harness", "quarantine", "add", "t.py::test_flaky"]
    reason = argv[argv.index("--reason") + 1]
    assert reason.startswith("history: failed 2 of 12 runs (17%); 4 flip(s)")
    assert argv[argv.index("--issue") + 1] == "https://x/1"


@pytest.mark.parametrize(("passes", "lifted"), [(58, False), (59, True)])
def test_a_quarantined_test_is_proposed_for_removal_after_n_passes_and_not_before(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    quarantine_entry: object,
    passes: int,
    lifted: bool,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "quarantine.toml").write_text(quarantine_entry("t.py::test_q"))  # type: ignore[operator]
    db = str(tmp_path / "h.db")
    outcomes = ["passed", "quarantined"] * 5 + ["passed"] * passes
    with open_store(db) as store:
        for r, outcome in enumerate(outcomes):
            store.append(_run(f"r{r}", float(r), {"t.py::test_q": outcome}, tree=f"{r:040x}"))
    code, out = _invoke("history", "flaky", "--db", db, "--propose", "--window", "5")
    assert code == 0
    assert ("harness quarantine remove t.py::test_q" in out.splitlines()) is lifted
    assert f"passed {passes} run(s) in a row; 59 needed (p = 5.0%, C = 95%)" in out


def test_the_shipped_migrations_end_at_the_revision_the_store_expects() -> None:
    assert head_revision() == HEAD


# ----------------------------------------------------------------------- from harness run

PASSING = {"suites/unit/test_ok.py": "def test_ok():\n    pass\n"}


def test_harness_run_appends_its_report_to_the_configured_history(
    project: object, pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    project(PASSING)  # type: ignore[operator]
    db = pytester.path / "history.db"
    monkeypatch.setenv(ENV_VAR, str(db))
    args = (sys.executable, "-m", "harness.cli", "run", "--tier", "unit", "--seed", "7")
    assert pytester.run(*args, "--report-dir", "a", timeout=120).ret == 0
    with open_store(db) as store:
        assert store.run_count() == 1
        (obs,) = store.observations(None)["suites/unit/test_ok.py::test_ok"]
    report = json.loads((pytester.path / "a" / "report.json").read_text())
    assert (obs.outcome, obs.seed) == ("passed", report["tests"][0]["seed"])


def test_a_history_that_cannot_be_written_is_one_warning_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV_VAR, "mysql://nobody:secret@nowhere/db")
    report = {"tests": [{"nodeid": "t.py::x", "outcome": "passed", "seed": 1}]}
    assert record_run(report, "out/report.json") is False
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"warning: test history not updated ({ENV_VAR}=mysql://nobody:***@nowhere/db): "
        "unsupported history database URL 'mysql://nobody:***@nowhere/db': use a file path "
        "or sqlite:///PATH for SQLite, or postgresql://USER@HOST:PORT/DB for PostgreSQL"
    ]
    monkeypatch.delenv(ENV_VAR)
    assert record_run(report, "out/report.json") is None  # not configured: nothing at all


# ----------------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    from reference_impls.tracking.postgres import PostgresCluster, find_pg_bin

    if find_pg_bin() is None:
        pytest.skip(
            "PostgreSQL binaries not under /usr/lib/postgresql/*/bin (.ci/run installs them)"
        )
    # Not under pytest's basetemp (private, 0700): the server runs as the postgres user.
    workdir = tempfile.mkdtemp(prefix="history-pg-")
    try:
        cluster = PostgresCluster.start(workdir)
        cluster.stop_mode = "immediate"  # throwaway data
        try:
            yield cluster.create_database("history")
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_the_store_round_trips_runs_through_postgresql_beside_another_alembic_project(
    pg_url: str, tmp_path: Path
) -> None:
    runs = [
        _run("a", 1.0, {"t.py::x": "passed", "t.py::y": "failed"}, tree="t1", seed=2**62),
        _run("b", 2.0, {"t.py::x": "error", "t.py::y": "passed"}, tree="t2"),
    ]
    seen = []
    for url in (pg_url, str(tmp_path / "h.db")):
        # A database shared with another Alembic project (the tracking store, say).
        other = sa.create_engine(normalize_url(url))
        with other.begin() as conn:
            conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32))"))
            conn.execute(sa.text("INSERT INTO alembic_version VALUES ('other-project')"))
        with open_store(url) as store:
            assert [store.append(r) for r in [*runs, runs[0]]] == [True, True, False]
            seen.append(
                {
                    n: [(o.outcome, o.seed, o.tree, o.runner, o.duration_s) for o in obs]
                    for n, obs in store.observations(2).items()
                }
            )
        with other.connect() as conn:
            assert conn.execute(sa.text("SELECT * FROM alembic_version")).all() == [
                ("other-project",)
            ]
        other.dispose()
    assert seen[0] == seen[1]
    assert seen[0]["t.py::y"][0] == ("failed", 2**62, "t1", "cpu-1", 0.1)


def test_summaries_and_scores_on_postgresql_match_sqlite_and_survive_the_migration(
    pg_url: str, tmp_path: Path
) -> None:
    """Store.scores (summaries upserted at append time, counts in SQL) on the real
    PostgreSQL: the same scores as on SQLite for the same runs, and revision 0002 recomputes
    the summaries a downgrade dropped."""
    import random

    from test_history_store import _history, check_summaries_survive_a_downgrade_and_upgrade

    records = _history(random.Random(9), 16, 24)
    got = []
    for url in (pg_url, str(tmp_path / "h.db")):
        with open_store(url) as store:
            for record in records:
                store.append(record)
            for window in (4, 12, None):
                want = {n: sc.score(n, o) for n, o in store.observations(window).items()}
                mine = {s.nodeid: s for s in store.scores(window)}
                assert mine == want, (url, window)
            got.append(sorted((s.nodeid, s.verdict, s.strip) for s in store.scores(16)))
            check_summaries_survive_a_downgrade_and_upgrade(store)
    assert got[0] and got[0] == got[1]


@pytest.mark.parametrize(
    ("make", "command", "complaint"),
    [
        ("text", "flaky", "h.db: file is not a database"),
        ("newer", "flaky", "its schema is at revision 9999, which this harness does not know"),
        ("newer", "import", "its schema is at revision 9999, which this harness does not know"),
        ("missing", "flaky", "no history database at {path}: nothing has been appended"),
        ("missing", "page", "no history database at {path}: nothing has been appended"),
        ("directory", "flaky", "history database {path} is a directory, not a SQLite file"),
    ],
)
def test_a_database_that_cannot_be_read_is_refused_with_its_path_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: str, command: str, complaint: str
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "h.db"
    if make == "text":
        db.write_text("not a database, but long enough to be mistaken for a header\n" * 4)
    elif make == "newer":  # a database a newer harness migrated past this one's revisions
        open_store(db).close()
        engine = sa.create_engine(normalize_url(db))
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE harness_history_version SET version_num = '9999'"))
        engine.dispose()
    elif make == "directory":
        db.mkdir()
    junit = tmp_path / "jest.xml"
    junit.write_text(OTHER_TOOL_JUNIT)
    args = {"flaky": ["flaky"], "page": ["page"], "import": ["import", str(junit)]}
    code, out = _invoke("history", *args[command], "--db", str(db))
    assert code == 2, out
    assert complaint.format(path=db) in out
    assert "Traceback" not in out and "sqlalche.me" not in out
    if make == "missing":
        assert not db.exists(), "a command that only reads created the database"


def test_an_empty_history_says_so_instead_of_scoring_nothing(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    open_store(db).close()
    code, out = _invoke("history", "flaky", "--db", str(db))
    assert code == 0 and "the history holds no runs yet" in out, out
    code, out = _invoke("history", "page", "--db", str(db), "--out", str(tmp_path / "p.html"))
    assert code == 0 and "holds no runs yet: the page lists no test" in out, out


def test_appenders_at_once_on_postgresql_lose_no_count(pg_url: str) -> None:
    """Four threads append runs of the same new tests at once, each in its own order (one
    reversed): every run is stored, no append fails (a deadlock or a duplicate key would),
    and each test's summary counts every run."""
    import random
    import threading

    from test_history_store import summaries

    nodeids = [f"suites/unit/test_c.py::test_{i}" for i in range(300)]
    errors: list[Exception] = []

    def append(worker: int) -> None:
        rng = random.Random(worker)
        order = list(reversed(nodeids)) if worker % 2 else list(nodeids)
        try:
            with open_store(pg_url) as store:
                for r in range(5):
                    results = {n: rng.choice(["passed", "failed", "skipped"]) for n in order}
                    store.append(_run(f"c{worker}-{r}", 100.0 + r, results, tree=f"t{r}"))
        except Exception as exc:  # reported below, with the others
            errors.append(exc)

    # Migrated first: Alembic keeps its migration context in module globals, so threads of
    # one process must not migrate at once (CI appenders are processes, each its own).
    open_store(pg_url).close()
    threads = [threading.Thread(target=append, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    with open_store(pg_url) as store:
        with store.engine.connect() as conn:
            ids = dict(conn.exec_driver_sql("SELECT nodeid, id FROM tests").all())
        counts = summaries(store)
        observed = store.observations(None, tests=nodeids)
    for n in nodeids:
        obs = observed[n]
        assert len(obs) == 20
        assert counts[ids[n]] == (
            20,
            sum(o.outcome == "passed" for o in obs),
            sum(o.outcome == "failed" for o in obs),
        )
