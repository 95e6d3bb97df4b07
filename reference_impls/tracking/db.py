"""Engines and migrations: SQLite (embedded default, WAL) and PostgreSQL (psycopg 3).

SQLite is opened in WAL mode (readers never block the writer), ``synchronous=NORMAL`` (durable
at every checkpoint of the WAL; a process crash loses nothing committed), a busy timeout of
60 s (several processes may write one file: they queue instead of failing), foreign keys on,
and every transaction starts with ``BEGIN IMMEDIATE`` so that two writers never deadlock on
a read lock each wants to upgrade. Schema changes are Alembic migrations shipped inside the
package (``migrations/``); :func:`open_engine` brings a database to the newest revision.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "check_sqlite_path",
    "current_revision",
    "downgrade",
    "head_revision",
    "migrate",
    "normalize_url",
    "open_engine",
    "open_read_engine",
]

MIGRATIONS = Path(__file__).with_name("migrations")
HEAD = "0001"
"""The newest migration's revision. Opening a database at HEAD reads one row and imports
nothing of Alembic (a worker process starts faster); a test checks it against the scripts."""
SQLITE_BUSY_TIMEOUT_MS = 60_000
SQLITE_READ_CACHE_KIB = 16_384  # per reading connection (SQLite keeps it between reads)


def normalize_url(url: str | os.PathLike[str]) -> str:
    """A database URL from a URL or a plain path (a path means a SQLite file).

    ``postgresql://`` is given the psycopg 3 driver, the only PostgreSQL driver installed.
    """
    text = os.fspath(url)
    if "://" not in text:
        return "sqlite:///" + str(Path(text).resolve())
    if text.startswith("postgresql://") or text.startswith("postgres://"):
        return "postgresql+psycopg://" + text.split("://", 1)[1]
    if text.startswith(("sqlite:", "postgresql+psycopg:")):
        return text
    raise ValueError(
        f"unsupported database URL {text!r}: use a file path or sqlite:///PATH for SQLite, "
        "or postgresql://USER@HOST:PORT/DB for PostgreSQL"
    )


SQLITE_HEADER = b"SQLite format 3\x00"


def _first_non_directory(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` that is not a directory, or None."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def check_sqlite_path(path: str | os.PathLike[str]) -> Path:
    """``path`` if a SQLite database can live there, else a TrackingError saying why.

    Checked before anything is created, so that a bad path leaves no directory behind and
    fails with its name instead of the driver's "unable to open database file"."""
    from reference_impls.tracking.errors import TrackingError

    p = Path(path)
    blocker = _first_non_directory(p)
    if blocker is not None:
        raise TrackingError(f"database {str(p)!r}: {str(blocker)!r} is a file, not a directory")
    if p.is_dir():
        raise TrackingError(f"database {str(p)!r} is a directory; give a file path in it")
    if p.exists():
        try:
            with p.open("rb") as f:
                head = f.read(len(SQLITE_HEADER))
        except OSError as exc:
            raise TrackingError(f"database {str(p)!r} cannot be read: {exc.strerror}") from None
        if head and head != SQLITE_HEADER[: len(head)]:
            raise TrackingError(f"database {str(p)!r} exists and is not a SQLite database")
    return p


def _sqlite_setup(engine: Engine, *, immediate: bool = True) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        # The driver's own transaction handling is switched off; SQLAlchemy's "begin" event
        # below emits BEGIN IMMEDIATE instead.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def open_engine(url: str | os.PathLike[str], *, migrate_schema: bool = True) -> Engine:
    """An engine for ``url`` with the schema migrated to the newest revision."""
    full = normalize_url(url)
    if full.startswith("sqlite"):
        path = full.removeprefix("sqlite:///")
        if path and path != ":memory:":
            check_sqlite_path(path)
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(full, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _sqlite_setup(engine)
    else:
        engine = create_engine(full, pool_pre_ping=True)
    if migrate_schema:
        migrate(engine)
    return engine


def open_read_engine(engine: Engine) -> Engine:
    """An engine for reads next to a writing one. On SQLite its transactions begin DEFERRED:
    in WAL mode readers see a consistent snapshot without taking the write lock, so reads
    never queue behind each other or behind a writer. On PostgreSQL it is the same engine."""
    if engine.dialect.name != "sqlite":
        return engine
    reader = create_engine(engine.url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
    _sqlite_setup(reader, immediate=False)

    @event.listens_for(reader, "connect")
    def _cache(dbapi_connection: Any, _record: Any) -> None:
        # A page of search results reads a few hundred scattered pages (runs, params, tags,
        # latest metrics); SQLite's default 2 MiB cache evicts them between searches.
        dbapi_connection.execute(f"PRAGMA cache_size=-{SQLITE_READ_CACHE_KIB}")

    return reader


def _config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    """The database's schema revision (None for an empty database)."""
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).all()
    except DBAPIError:  # no alembic_version table: nothing migrated yet
        return None
    return rows[0][0] if len(rows) == 1 else None


def migrate(engine: Engine, revision: str = "head") -> None:
    """Upgrade the schema (idempotent; concurrent callers serialize on the database lock)."""
    if revision == "head" and current_revision(engine) == HEAD:
        return
    from alembic import command

    cfg = _config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    """Undo migrations down to ``revision`` ("base": no tables at all)."""
    from alembic import command

    cfg = _config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
