"""The history database: SQLite by default, PostgreSQL for a team, schema by Alembic.

A database is named by a URL or a plain path (a path is a SQLite file). SQLite is opened in
WAL mode with a busy timeout, and every write transaction starts ``BEGIN IMMEDIATE``: several
``harness run`` processes of one machine may append to one file and queue instead of failing.
PostgreSQL (``postgresql://USER@HOST:PORT/DB``) is for a team whose CI runners share one
history. :func:`open_store` brings the schema to the newest Alembic revision shipped in
``migrations/``; a database already there costs one read and no Alembic import.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from itertools import groupby
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.history import scores as sc
from harness.history.records import (
    FAIL_OUTCOMES,
    PASS_OUTCOMES,
    HistoryError,
    Observation,
    RunRecord,
)
from harness.history.scores import DEFAULT_MIN_RUNS, Score

if TYPE_CHECKING:
    from sqlalchemy import Engine

__all__ = ["HEAD", "Store", "database_problem", "normalize_url", "open_store", "safe_url"]

MIGRATIONS = Path(__file__).with_name("migrations")
HEAD = "0002"
"""The newest migration's revision (a test checks it against the scripts)."""
SQLITE_BUSY_TIMEOUT_MS = 60_000
_CHUNK = 500  # bound parameters per IN (...): under every backend's limit


def normalize_url(url: str | os.PathLike[str]) -> str:
    """A SQLAlchemy URL from a database URL or a plain path (a SQLite file)."""
    text = os.fspath(url)
    if not text.strip():
        raise HistoryError("empty history database URL: give a file path or a database URL")
    if "://" not in text:
        return "sqlite:///" + str(Path(text).resolve())
    if text.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + text.split("://", 1)[1]
    if text.startswith(("sqlite:///", "postgresql+psycopg://")):
        return text
    raise HistoryError(
        f"unsupported history database URL {safe_url(text)!r}: use a file path or "
        "sqlite:///PATH for SQLite, or postgresql://USER@HOST:PORT/DB for PostgreSQL"
    )


def _sqlalchemy() -> Any:
    try:
        import alembic  # noqa: F401
        import sqlalchemy
    except ImportError:
        raise HistoryError(
            "the test history needs SQLAlchemy and Alembic: pip install 'ml-harness[history]'"
        ) from None
    return sqlalchemy


def _engine(full: str) -> Engine:
    sa = _sqlalchemy()
    from sqlalchemy import event

    if full.startswith("sqlite"):
        path = full.removeprefix("sqlite:///")
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine: Engine = sa.create_engine(
            full, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        )

        @event.listens_for(engine, "connect")
        def _connect(dbapi_connection: Any, _record: Any) -> None:
            # The driver's own transaction handling is off; "begin" below emits BEGIN IMMEDIATE.
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    try:
        return sa.create_engine(full, pool_pre_ping=True)  # type: ignore[no-any-return]
    except (ImportError, sa.exc.ArgumentError) as exc:
        raise HistoryError(f"cannot open history database {full!r}: {exc}") from None


def _current_revision(engine: Engine) -> str | None:
    sa = _sqlalchemy()
    from harness.history.schema import VERSION_TABLE

    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    except sa.exc.DBAPIError:  # no version table: nothing migrated yet
        return None
    return rows[0][0] if len(rows) == 1 else None


def _alembic_config() -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def head_revision() -> str:
    """The newest revision among the shipped migration scripts."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None
    return head


def migrate(engine: Engine, revision: str = "head") -> None:
    """Upgrade the schema (idempotent; concurrent callers serialize on the database lock)."""
    if revision == "head" and _current_revision(engine) == HEAD:
        return
    from alembic import command

    cfg = _alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def database_problem(exc: BaseException) -> str:
    """A driver's error in one line: its own message, without SQLAlchemy's wrapping (the
    statement, the parameters, a link)."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc)
    return " ".join(text.split()) or type(exc).__name__


def open_store(url: str | os.PathLike[str], *, create: bool = True) -> Store:
    """The history at ``url``, created (unless ``create`` is false: then a SQLite file that
    does not exist is refused) or upgraded to the newest schema."""
    full = normalize_url(url)
    if not create and full.startswith("sqlite:///"):
        path = Path(full.removeprefix("sqlite:///"))
        if path.is_dir():
            raise HistoryError(f"history database {path} is a directory, not a SQLite file")
        if not path.is_file():
            raise HistoryError(
                f"no history database at {path}: nothing has been appended to it (harness "
                "run appends when HARNESS_HISTORY_DB names it; harness history import adds "
                "reports)"
            )
    sa = _sqlalchemy()
    from alembic.util import CommandError

    engine = _engine(full)
    try:
        migrate(engine)
    except sa.exc.SQLAlchemyError as exc:
        engine.dispose()
        raise HistoryError(
            f"cannot open history database {safe_url(full)}: {database_problem(exc)}"
        ) from None
    except CommandError as exc:
        # A revision this harness does not ship: the database was made by a newer harness
        # (or is another project's Alembic database).
        engine.dispose()
        raise HistoryError(
            f"cannot open history database {safe_url(full)}: its schema is at revision "
            f"{_current_revision(engine) or '?'}, which this harness does not know (its newest "
            f"is {HEAD}): {exc}; upgrade ml-harness, or use another database"
        ) from None
    return Store(engine)


def safe_url(url: str) -> str:
    """A URL without its password, for messages."""
    head, sep, rest = url.partition("://")
    if "@" in rest and ":" in rest.split("@", 1)[0]:
        user = rest.split("@", 1)[0].split(":", 1)[0]
        rest = f"{user}:***@{rest.split('@', 1)[1]}"
    return head + sep + rest


def _chunks(items: Sequence[Any], size: int = _CHUNK) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _fetch_tuples(conn: Any, query: Any) -> list[tuple[Any, ...]]:
    """The rows of a select of integers and plain columns as the driver's own tuples: through
    the DBAPI cursor of ``conn``, without a SQLAlchemy row per result (~200,000 of them when
    the tests that failed are read over a whole history). Bound values (integers here) are
    rendered into the statement."""
    statement = str(query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    cursor = conn.connection.cursor()
    try:
        cursor.execute(statement)
        return list(cursor.fetchall())
    finally:
        cursor.close()


class Store:
    """Appends runs and reads outcomes back. Close it (or use ``with``) when done."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.engine.dispose()

    @property
    def url(self) -> str:
        return safe_url(self.engine.url.render_as_string(hide_password=True))

    def append(self, run: RunRecord) -> bool:
        """Add a run and its results in one transaction; False when it is already there."""
        sa = _sqlalchemy()
        from harness.history.schema import Result, Run

        with self.engine.begin() as conn:
            if conn.execute(sa.select(Run.id).where(Run.run_key == run.run_key)).first():
                return False
            run_id = conn.execute(
                sa.insert(Run).returning(Run.id),
                {
                    "run_key": run.run_key,
                    "started_at": run.started_at,
                    "source": run.source,
                    "commit": run.commit,
                    "tree": run.tree,
                    "runner": run.runner,
                    "fingerprint": run.fingerprint,
                    "seed": run.seed,
                    "status": run.status,
                    "label": (run.label or "")[:500] or None,
                },
            ).scalar_one()
            # One report names a test once; if a tool repeats a case, the last one stands.
            latest = {r.nodeid: r for r in run.results}
            ids = self._test_ids(conn, list(latest))
            rows = [
                {
                    "run_id": run_id,
                    "test_id": ids[r.nodeid],
                    "outcome": r.outcome,
                    "duration_s": r.duration_s,
                    "seed": r.seed,
                }
                for r in latest.values()
            ]
            if rows:
                conn.execute(sa.insert(Result), rows)
                self._add_to_summaries(conn, rows)
        return True

    @staticmethod
    def _add_to_summaries(conn: Any, rows: list[dict[str, Any]]) -> None:
        """Add one run's results to the per-test counts (in the caller's transaction)."""
        from sqlalchemy.dialects import postgresql, sqlite

        from harness.history.schema import TestSummary

        dialect: Any = postgresql if conn.dialect.name == "postgresql" else sqlite
        statement = dialect.insert(TestSummary)
        # An upsert: two PostgreSQL appenders meeting a new test both add to one row.
        statement = statement.on_conflict_do_update(
            index_elements=["test_id"],
            set_={
                "results": TestSummary.results + statement.excluded.results,
                "passes": TestSummary.passes + statement.excluded.passes,
                "failures": TestSummary.failures + statement.excluded.failures,
            },
        )
        conn.execute(
            statement,
            [
                {
                    "test_id": r["test_id"],
                    "results": 1,
                    "passes": int(r["outcome"] in PASS_OUTCOMES),
                    "failures": int(r["outcome"] in FAIL_OUTCOMES),
                }
                # In test-id order: two PostgreSQL appenders lock the rows they update in the
                # same order, so neither waits on the other in a cycle (a deadlock).
                for r in sorted(rows, key=lambda r: int(r["test_id"]))
            ],
        )

    @staticmethod
    def _test_ids(conn: Any, nodeids: list[str]) -> dict[str, int]:
        sa = _sqlalchemy()
        from harness.history.schema import Test

        ids: dict[str, int] = {}
        for chunk in _chunks(nodeids):
            ids.update(
                (n, i)
                for n, i in conn.execute(
                    sa.select(Test.nodeid, Test.id).where(Test.nodeid.in_(chunk))
                )
            )
        # Sorted: two PostgreSQL appenders inserting the same new tests take their unique
        # keys in one order, so neither waits on the other in a cycle (a deadlock).
        missing = sorted(n for n in nodeids if n not in ids)
        if missing:
            # Two runners appending at once may both meet a new test: on PostgreSQL (SQLite
            # serializes writers) the second insert must not fail the second run's append.
            if conn.dialect.name == "postgresql":
                from sqlalchemy.dialects.postgresql import insert as pg_insert

                statement = pg_insert(Test).on_conflict_do_nothing(index_elements=["nodeid"])
            else:
                statement = sa.insert(Test)
            conn.execute(statement, [{"nodeid": n} for n in missing])
            for chunk in _chunks(missing):
                ids.update(
                    (n, i)
                    for n, i in conn.execute(
                        sa.select(Test.nodeid, Test.id).where(Test.nodeid.in_(chunk))
                    )
                )
        return ids

    def run_count(self) -> int:
        sa = _sqlalchemy()
        from harness.history.schema import Run

        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(Run)).scalar_one())

    def _window(self, conn: Any, window: int | None) -> dict[int, tuple[Any, ...]]:
        """The runs of the last ``window`` (all when None), newest first, by id."""
        sa = _sqlalchemy()
        from harness.history.schema import Run

        runs_q = sa.select(
            Run.id, Run.started_at, Run.tree, Run.commit, Run.runner, Run.seed
        ).order_by(Run.started_at.desc(), Run.id.desc())
        if window is not None:
            runs_q = runs_q.limit(window)
        return {row[0]: tuple(row) for row in conn.execute(runs_q)}

    @staticmethod
    def _read(
        conn: Any,
        runs: dict[int, tuple[Any, ...]],
        names: dict[int, str],
        by_test: bool,
    ) -> dict[str, list[Observation]]:
        """The outcomes in ``runs`` of the tests in ``names``, oldest first per test: read per
        test (``by_test``: a few tests, through the (test_id, run_id) index) or per run."""
        sa = _sqlalchemy()
        from harness.history.schema import Result

        out: dict[str, list[Observation]] = defaultdict(list)
        # Columns, not ORM objects, and run details joined here rather than in SQL: a
        # window is ~100,000 results, and per-row overhead would cost more than the query.
        cols = (Result.test_id, Result.run_id, Result.outcome, Result.seed, Result.duration_s)
        if by_test:
            queries = [sa.select(*cols).where(Result.test_id.in_(c)) for c in _chunks(list(names))]
        else:
            # One query per run, oldest first: each test's list comes out in order, with
            # no sort, and each query reads one contiguous key range.
            queries = [sa.select(*cols).where(Result.run_id == r) for r in reversed(runs)]
        # tuple.__new__ builds the named tuple without its __new__'s Python frame: a window
        # of the failing tests of 1,000 runs is ~200,000 of them.
        make = tuple.__new__
        for q in queries:
            for test_id, run_id, outcome, seed, duration in conn.execute(q).all():
                run = runs.get(run_id)
                name = names.get(test_id)
                if run is None or name is None:
                    continue
                out[name].append(
                    make(
                        Observation,
                        (run_id, run[1], outcome, seed, run[2], run[3], run[4], duration, run[5]),
                    )
                )
        if by_test:
            for obs in out.values():
                obs.sort(key=lambda o: (o.started_at, o.run_id))
        return dict(out)

    def observations(
        self, window: int | None = None, tests: Iterable[str] | None = None
    ) -> dict[str, list[Observation]]:
        """Every recorded outcome per node id, oldest first, over the last ``window`` runs
        (all runs when None), optionally of the named ``tests`` only."""
        if window is not None and window < 1:
            raise HistoryError(f"window must be at least 1 run, got {window}")
        sa = _sqlalchemy()
        from harness.history.schema import Test

        with self.engine.connect() as conn:
            runs = self._window(conn, window)
            if not runs:
                return {}
            if tests is None:
                names = dict(conn.execute(sa.select(Test.id, Test.nodeid)).all())
            else:
                names = {}
                for chunk in _chunks(sorted(set(tests))):
                    names.update(
                        conn.execute(
                            sa.select(Test.id, Test.nodeid).where(Test.nodeid.in_(chunk))
                        ).all()
                    )
            return self._read(conn, runs, names, by_test=tests is not None)

    def scores(self, window: int | None = None, *, min_runs: int = DEFAULT_MIN_RUNS) -> list[Score]:
        """Every test's score over the last ``window`` runs (all when None), in no order.

        What :func:`~harness.history.scores.score` gives on :meth:`observations`, without
        reading every outcome. Each test's results, passes and failures in the window come
        from whichever reads fewer results: the summaries alone (the window is the whole
        history), the window's own results counted in SQL (it is at most half of the
        history), or the summaries minus the counts of the runs before the window. Only the
        tests that failed in the window, or both passed and skipped, have their outcomes
        read (through the covering index) and scored one by one; a test that only passed or
        only skipped is scored from its counts.
        """
        if window is not None and window < 1:
            raise HistoryError(f"window must be at least 1 run, got {window}")
        sa = _sqlalchemy()
        from harness.history.schema import Result, Run, Test, TestSummary

        with self.engine.connect() as conn:
            runs = self._window(conn, window)
            if not runs:
                return []
            total_runs = conn.execute(sa.select(sa.func.count()).select_from(Run)).scalar_one()
            inside, outside = len(runs), total_runs - len(runs)
            lo, hi = min(runs), max(runs)
            # The window is a range of run ids when no run outside it has an id in
            # [lo, hi] (runs appended in time order): its results are then one key range
            # of each test in the covering index.
            id_range = (
                not outside
                or inside
                == conn.execute(
                    sa.select(sa.func.count()).select_from(Run).where(Run.id.between(lo, hi))
                ).scalar_one()
            )
            names = dict(conn.execute(sa.select(Test.id, Test.nodeid)).all())
            out: list[Score] = []
            mixed: dict[int, str] = {}
            if outside and id_range:
                # Per test, two counts over its range of the index (results, and results
                # other than "passed"): no expression per row, no GROUP BY sort. A test
                # that only passed is scored from its count; any other is read.
                within = Result.run_id.between(lo, hi)
                in_window = sa.and_(Result.test_id == Test.id, within)
                query = sa.select(
                    Test.id,
                    sa.select(sa.func.count()).where(in_window).scalar_subquery(),
                    sa.select(sa.func.count())
                    .where(in_window, Result.outcome != "passed")
                    .scalar_subquery(),
                )
                for test_id, total, other in conn.execute(query):
                    if not total:
                        continue  # not in any run of the window
                    if other:
                        mixed[test_id] = names[test_id]
                    else:
                        strip = "P" * total
                        out.append(
                            sc.score_without_failures(names[test_id], strip, min_runs=min_runs)
                        )
                out.extend(self._score_read(conn, runs, mixed, within, min_runs, exact=True))
                return out
            counts: dict[int, list[int]] = {}
            if inside <= outside:
                counts = self._counts(conn, newest=True, limit=inside)
            else:
                summary = sa.select(
                    TestSummary.test_id,
                    TestSummary.results,
                    TestSummary.passes,
                    TestSummary.failures,
                )
                counts = {t: [n, p, f] for t, n, p, f in conn.execute(summary)}
                if outside:
                    for test_id, (n, p, f) in self._counts(
                        conn, newest=False, limit=outside
                    ).items():
                        have = counts[test_id]
                        counts[test_id] = [have[0] - n, have[1] - p, have[2] - f]
            for test_id, (total, passes, fails) in counts.items():
                if total == 0:
                    continue  # not in any run of the window
                nodeid = names[test_id]
                if fails == 0 and passes in (0, total):
                    strip = ("P" if passes else "s") * total
                    out.append(sc.score_without_failures(nodeid, strip, min_runs=min_runs))
                else:
                    mixed[test_id] = nodeid
            if outside:  # the window's runs only (a subquery of run ids)
                recent = (
                    sa.select(Run.id)
                    .order_by(Run.started_at.desc(), Run.id.desc())
                    .limit(inside)
                    .scalar_subquery()
                )
                within = Result.run_id.in_(recent)
            else:  # every run: those of [lo, hi] are the window's (a later one is not)
                within = Result.run_id.between(lo, hi)
            out.extend(self._score_read(conn, runs, mixed, within, min_runs, exact=not outside))
        return out

    @staticmethod
    def _score_read(
        conn: Any,
        runs: dict[int, tuple[Any, ...]],
        names: dict[int, str],
        within: Any,
        min_runs: int,
        *,
        exact: bool,
    ) -> list[Score]:
        """The scores of the tests in ``names`` from their outcomes in ``runs``: read in
        (test, run) order from the covering index (no sort, no ORM object, no Observation per
        outcome) and scored as columns (:func:`~harness.history.scores.score_columns`)."""
        sa = _sqlalchemy()
        from harness.history.schema import Result

        # Run ids in window order (oldest first), as run ids ascend when the runs were
        # appended in time order; otherwise each test's outcomes are sorted by position.
        oldest_first = list(reversed(runs))
        position = None if oldest_first == sorted(runs) else {r: i for i, r in enumerate(runs)}
        cols = (Result.test_id, Result.run_id, Result.outcome, Result.seed, Result.duration_s)
        out: list[Score] = []
        for chunk in _chunks(sorted(names)):
            query = (
                sa.select(*cols)
                .where(Result.test_id.in_(chunk), within)
                .order_by(Result.test_id, Result.run_id)
            )
            rows = _fetch_tuples(conn, query)
            if not exact:  # a run appended since the window was read is not in it
                rows = [row for row in rows if row[1] in runs]
            for test_id, group in groupby(rows, key=itemgetter(0)):
                obs = list(group)
                if position is not None:
                    obs.sort(key=lambda row: -position[row[1]])
                _, run_ids, outcomes, seeds, durations = zip(*obs, strict=True)
                run_rows = [runs[r] for r in run_ids]

                def observation(
                    i: int,
                    run_ids: tuple[int, ...] = run_ids,
                    outcomes: tuple[str, ...] = outcomes,
                    seeds: tuple[Any, ...] = seeds,
                    durations: tuple[Any, ...] = durations,
                    run_rows: list[tuple[Any, ...]] = run_rows,
                ) -> Observation:
                    run = run_rows[i]
                    return Observation(
                        run_ids[i], run[1], outcomes[i], seeds[i], run[2], run[3], run[4],
                        durations[i], run[5],
                    )  # fmt: skip

                out.append(
                    sc.score_columns(
                        names[test_id],
                        outcomes,
                        seeds,
                        [run[2] for run in run_rows],
                        [run[4] for run in run_rows],
                        observation,
                        min_runs=min_runs,
                    )
                )
        return out

    @staticmethod
    def _counts(conn: Any, *, newest: bool, limit: int) -> dict[int, list[int]]:
        """Per test id: [results, passes, failures] in the ``limit`` newest (or oldest) runs."""
        sa = _sqlalchemy()
        from harness.history.schema import Result, Run

        order = (Run.started_at.desc(), Run.id.desc()) if newest else (Run.started_at, Run.id)
        ids = sa.select(Run.id).order_by(*order).limit(limit).scalar_subquery()
        fail = sa.case((Result.outcome.in_(sorted(FAIL_OUTCOMES)), 1), else_=0)
        passed = sa.case((Result.outcome.in_(sorted(PASS_OUTCOMES)), 1), else_=0)
        query = (
            sa.select(Result.test_id, sa.func.count(), sa.func.sum(passed), sa.func.sum(fail))
            .where(Result.run_id.in_(ids))
            .group_by(Result.test_id)
        )
        return {t: [n, p, f] for t, n, p, f in conn.execute(query)}
