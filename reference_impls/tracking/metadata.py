"""The metadata store: projects, runs, typed params, metric series, tags, artifact references,
upload intents and lineage edges on SQLAlchemy 2 (SQLite or PostgreSQL, schema in schema.py).

Every write is one transaction. Metric batches are upserts keyed by (run, key, step), so a
batch sent twice (a client retrying after a lost answer) stores each point once; the same
transaction moves ``latest_metrics`` forward for the keys the batch touched. Values are
checked before anything is written: a bad value fails the whole call and writes nothing.

Over 500 lines, one concern: :class:`MetadataStore` is the one writer of the schema, and a write
that touches several tables (a metric batch and ``latest_metrics``, a run and its tags) stays
one transaction inside one method.
"""

from __future__ import annotations

import enum
import json
import math
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Engine,
    bindparam,
    delete,
    func,
    insert,
    literal,
    null,
    select,
    union_all,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite

from reference_impls.tracking.db import open_engine, open_read_engine
from reference_impls.tracking.errors import IntegrityError, NotFoundError, TrackingError
from reference_impls.tracking.schema import (
    Artifact,
    LatestMetric,
    LineageEdge,
    Metric,
    Param,
    Project,
    Run,
    Tag,
    Upload,
)

__all__ = [
    "ArtifactRef",
    "MetadataStore",
    "MetricPoint",
    "RunInfo",
    "RunStatus",
    "check_key",
    "check_metric",
    "check_artifact_kind",
    "check_git_commit",
    "check_param",
    "check_text",
]

KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]{0,249}")
PROJECT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}")
MAX_STR_PARAM = 10_000  # characters; longer text belongs in an artifact
MAX_EXACT_INT = 2**53  # larger integers do not survive a float column exactly
MAX_STEP = 2**31 - 1  # the step column is a 32-bit INTEGER on PostgreSQL
SQL_CHUNK = 5_000  # rows per executemany: bounded statement memory, few round trips


class RunStatus(enum.StrEnum):
    """Lifecycle of a run. RUNNING -> FINISHED | FAILED | KILLED (a run is ended once)."""

    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    KILLED = "killed"


@dataclass(frozen=True)
class MetricPoint:
    key: str
    step: int
    value: float
    ts: float


@dataclass
class ArtifactRef:
    run_id: str
    name: str
    sha256: str
    size: int
    uri: str
    kind: str
    promoted: bool
    created_at: float
    deleted_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RunInfo:
    id: str
    project: str
    name: str
    status: str
    created_at: float
    ended_at: float | None
    git_commit: str | None
    environment: dict[str, Any] | None
    deleted_at: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # latest value per key

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def check_key(key: object, what: str = "key") -> str:
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise TrackingError(
            f"invalid {what} {key!r}: use 1-250 characters of letters, digits, '_', '.', '-', "
            "'/', starting with a letter or '_'"
        )
    return key


def check_text(value: str, what: str) -> str:
    """``value`` if both databases can store it as text, else a TrackingError naming it.

    A lone surrogate (``"\\udcff"``: valid JSON, valid Python, not encodable as UTF-8) fails
    in every driver, and PostgreSQL refuses NUL in text while SQLite stores it: refusing both
    here gives one answer on both backends instead of a driver's error from one of them."""
    if "\x00" in value:
        raise TrackingError(f"{what} {_clip(value)} contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TrackingError(
            f"{what} {_clip(value)} contains {value[exc.start]!r} at position {exc.start}, "
            "a lone surrogate that is not Unicode text (was it decoded with "
            "errors='surrogateescape'?)"
        ) from None
    return value


def _clip(value: str) -> str:
    """A readable, bounded excerpt of a bad value for a message (ASCII repr, never raw)."""
    return ascii(value[:60]) + ("..." if len(value) > 60 else "")


def check_param(key: str, value: object) -> tuple[str, float | None, str | None]:
    """(kind, num_value, str_value) for one param, or a TrackingError naming it."""
    check_key(key, "param name")
    if isinstance(value, bool):
        return "bool", float(value), None
    if isinstance(value, int):
        if abs(value) > MAX_EXACT_INT:
            raise TrackingError(
                f"param {key}={value} is larger than 2**53 and would lose digits as a number; "
                "pass it as a string"
            )
        return "num", float(value), None
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TrackingError(
                f"param {key}={value!r} is not a finite number; pass a finite value or a string"
            )
        return "num", value, None
    if isinstance(value, str):
        if len(value) > MAX_STR_PARAM:
            raise TrackingError(
                f"param {key} is {len(value)} characters long (limit {MAX_STR_PARAM}); "
                "log long text as an artifact"
            )
        return "str", None, check_text(value, f"param {key}")
    raise TrackingError(
        f"param {key} has type {type(value).__name__}; params are numbers, booleans or strings"
    )


def check_git_commit(commit: object) -> str:
    """A commit as runs store it (<= 64 characters) and lineage names it (``code:<commit>``)."""
    from reference_impls.tracking.lineage import check_node

    if not isinstance(commit, str) or not 1 <= len(commit) <= 64:
        raise TrackingError(f"git_commit must be 1-64 characters, got {_clip(str(commit))}")
    check_node(f"code:{commit}")
    return commit


KIND_RE = re.compile(r"[A-Za-z0-9_.\-]{1,32}")


def check_artifact_kind(kind: object) -> str:
    if not isinstance(kind, str) or not KIND_RE.fullmatch(kind):
        raise TrackingError(
            f"artifact kind {kind!r} must be 1-32 letters, digits, '_', '.', '-' "
            "(checkpoint, model, dataset, file, report...)"
        )
    return kind


def _is_run_id(run_id: object) -> bool:
    return isinstance(run_id, str) and re.fullmatch(r"[0-9a-f]{32}", run_id) is not None


def _param_value(kind: str, num: float | None, text: str | None) -> Any:
    if kind == "bool":
        return bool(num)
    if kind == "num":
        assert num is not None
        return int(num) if num.is_integer() and abs(num) <= MAX_EXACT_INT else num
    return text


_CHECKED_KEYS: set[str] = set()  # names that passed check_key (a few per run in practice)
_MAX_CHECKED_KEYS = 100_000


def check_metric(key: str, value: object, step: object) -> float:
    """The point's value as a float, or a TrackingError naming the key, step and problem.

    Called for every point on the training thread, so the common case (a known key, an int
    step, a float or int value) takes a few type checks and one set lookup."""
    if key not in _CHECKED_KEYS:
        check_key(key, "metric name")
        if len(_CHECKED_KEYS) < _MAX_CHECKED_KEYS:
            _CHECKED_KEYS.add(key)
    if type(step) is not int or not 0 <= step <= MAX_STEP:  # bool is not an int step
        raise TrackingError(f"metric {key}: step must be an integer in [0, 2**31), got {step!r}")
    kind = type(value)
    if kind is float:
        number: float = value  # type: ignore[assignment]
    elif kind is int:
        number = float(value)  # type: ignore[arg-type]
    elif kind is bool:
        raise TrackingError(f"metric {key} at step {step} is bool, not a number")
    else:
        try:  # numpy and torch scalars
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise TrackingError(
                f"metric {key} at step {step} is {kind.__name__}, not a number"
            ) from None
    if not math.isfinite(number):
        # SQLite stores NaN as NULL, so a non-finite point cannot be kept faithfully on both
        # databases; refusing it at the call loses nothing silently.
        raise TrackingError(
            f"metric {key} at step {step} is {number!r}; only finite values are stored "
            "(record a diverged run with a tag, e.g. tags={'diverged': 'step 1200'})"
        )
    return number


def _insert(engine: Engine, table: Any) -> Any:
    return (postgresql if engine.dialect.name == "postgresql" else sqlite).insert(table)


GET_RUNS_CHUNK = 2_000  # ids per statement: 3 bound copies stay far below both databases' limits
_IDS: Any = bindparam("ids", expanding=True)
# Columns in the order get_runs unpacks them.
_RUNS_BY_ID = (
    select(
        Run.id,
        Run.project_id,
        Run.name,
        Run.status,
        Run.created_at,
        Run.ended_at,
        Run.git_commit,
        Run.environment,
        Run.deleted_at,
        Project.name,
    )
    .join(Project, Project.id == Run.project_id)
    .where(Run.id.in_(_IDS))
)
# (run_id, 0 param | 1 tag | 2 latest metric, key, param kind, number, text)
_DETAILS_BY_RUN: Any = union_all(
    select(
        Param.run_id,
        literal(0),
        Param.key,
        Param.kind,
        Param.num_value,
        Param.str_value,
    ).where(Param.run_id.in_(_IDS)),
    select(
        Tag.run_id,
        literal(1),
        Tag.key,
        null(),
        null(),
        Tag.value,
    ).where(Tag.run_id.in_(_IDS)),
    select(
        LatestMetric.run_id,
        literal(2),
        LatestMetric.key,
        null(),
        LatestMetric.value,
        null(),
    ).where(LatestMetric.run_id.in_(_IDS)),
)


class MetadataStore:
    """All metadata reads and writes. Thread-safe (one pooled connection per call)."""

    def __init__(self, url_or_engine: str | Engine) -> None:
        self.engine = (
            url_or_engine if isinstance(url_or_engine, Engine) else open_engine(url_or_engine)
        )
        self.read_engine = open_read_engine(self.engine)  # reads only (see db.py)
        self._projects: dict[str, int] = {}

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()
        self.read_engine.dispose()

    # ------------------------------------------------------------------ projects and runs
    def project_id(self, name: str, *, create: bool = True) -> int:
        if name in self._projects:
            return self._projects[name]
        if not isinstance(name, str) or not PROJECT_RE.fullmatch(name):
            raise TrackingError(
                f"invalid project name {name!r}: 1-200 letters, digits, '_', '.', '-'"
            )
        with self.engine.begin() as conn:
            pid = conn.scalar(select(Project.id).where(Project.name == name))
            if pid is None:
                if not create:
                    raise NotFoundError(f"no project named {name!r}")
                stmt = _insert(self.engine, Project).values(name=name, created_at=time.time())
                conn.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
                pid = conn.scalar(select(Project.id).where(Project.name == name))
        assert pid is not None  # inserted above, by this or a concurrent writer
        self._projects[name] = pid
        return pid

    def projects(self) -> list[str]:
        with self.read_engine.connect() as conn:
            return list(conn.scalars(select(Project.name).order_by(Project.name)))

    def create_run(
        self,
        project: str,
        *,
        name: str | None = None,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        git_commit: str | None = None,
        environment: Mapping[str, Any] | None = None,
        created_at: float | None = None,
        run_id: str | None = None,
    ) -> str:
        """Insert a run with its params and tags in one transaction; returns its id."""
        rows = [(k, *check_param(k, v)) for k, v in (params or {}).items()]
        tag_rows = self._check_tags(tags or {})
        rid = run_id or uuid.uuid4().hex
        if not isinstance(rid, str) or not re.fullmatch(r"[0-9a-f]{32}", rid):
            raise TrackingError(f"run id {rid!r} is not 32 lowercase hex digits")
        if name is not None:
            if not isinstance(name, str) or len(name) > 200:
                raise TrackingError(f"run name must be a string of <= 200 characters, got {name!r}")
            check_text(name, "run name")
        if git_commit is not None:
            check_git_commit(git_commit)
        env_text = None
        if environment is not None:
            try:  # JSON escapes NUL and surrogates, so any JSON-able mapping stores as text
                env_text = json.dumps(environment, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise TrackingError(f"run environment is not JSON-serializable: {exc}") from None
        if created_at is not None and (
            isinstance(created_at, bool)
            or not isinstance(created_at, int | float)
            or not math.isfinite(created_at)
        ):
            raise TrackingError(f"created_at must be a finite UNIX time, got {created_at!r}")
        pid = self.project_id(project)  # last: a refused run creates no project
        with self.engine.begin() as conn:
            # The driver's (execute)many straight away, as for metric points: SQLAlchemy's
            # per-row statement building costs more than the inserts (values are checked
            # above and bound as parameters).
            conn.exec_driver_sql(
                self._marks(
                    "INSERT INTO runs (id, project_id, name, status, created_at, ended_at, "
                    "git_commit, environment, deleted_at) VALUES (?, ?, ?, ?, ?, NULL, ?, ?, NULL)"
                ),
                (
                    rid,
                    pid,
                    name or rid[:8],
                    RunStatus.RUNNING.value,
                    time.time() if created_at is None else created_at,
                    git_commit,
                    env_text,
                ),
            )
            if rows:
                conn.exec_driver_sql(
                    self._marks(
                        "INSERT INTO params (run_id, key, kind, num_value, str_value) "
                        "VALUES (?, ?, ?, ?, ?)"
                    ),
                    [(rid, *row) for row in rows],
                )
            if tag_rows:
                conn.exec_driver_sql(
                    self._marks("INSERT INTO tags (run_id, key, value) VALUES (?, ?, ?)"),
                    [(rid, *row) for row in tag_rows],
                )
        return rid

    @staticmethod
    def _check_tags(tags: Mapping[str, str]) -> list[tuple[str, str]]:
        out = []
        for k, v in tags.items():
            check_key(k, "tag name")
            if not isinstance(v, str) or len(v) > MAX_STR_PARAM:
                raise TrackingError(
                    f"tag {k} must be a string of <= {MAX_STR_PARAM} characters, got "
                    f"{type(v).__name__} {str(v)[:40]!r}"
                )
            out.append((k, check_text(v, f"tag {k}")))
        return out

    def _require_run(self, conn: Any, run_id: str) -> Any:
        row = conn.execute(
            select(Run.id, Run.status, Run.deleted_at, Run.project_id).where(Run.id == run_id)
        ).first()
        if row is None:
            raise NotFoundError(f"no run with id {run_id!r}")
        return row

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        rows = self._check_tags(tags)
        with self.engine.begin() as conn:
            self._require_run(conn, run_id)
            if not rows:
                # An empty executemany inserts one row of NULLs (SQLAlchemy), an
                # IntegrityError on the primary key: no tags is nothing to write.
                return
            stmt = _insert(self.engine, Tag)
            stmt = stmt.on_conflict_do_update(
                index_elements=["run_id", "key"], set_={"value": stmt.excluded.value}
            )
            conn.execute(stmt, [{"run_id": run_id, "key": k, "value": v} for k, v in rows])

    def end_run(
        self,
        run_id: str,
        status: RunStatus | str = RunStatus.FINISHED,
        points: Sequence[MetricPoint] = (),
    ) -> None:
        """End a run, writing its last buffered ``points`` in the same transaction (a run's
        final flush and its end are one commit, not two)."""
        try:
            status = RunStatus(status)
        except ValueError:  # a bare ValueError was a 500 over HTTP
            raise TrackingError(
                f"run status {_clip(str(status))} is not one of finished, failed, killed"
            ) from None
        if status is RunStatus.RUNNING:
            raise TrackingError("end_run needs a final status: finished, failed or killed")
        for p in points:
            check_metric(p.key, p.value, p.step)
        with self.engine.begin() as conn:
            ended = conn.execute(
                update(Run)
                .where(Run.id == run_id)
                .values(status=status.value, ended_at=time.time())
            ).rowcount
            if not ended:
                raise NotFoundError(f"no run with id {run_id!r}")
            self._write_points(conn, run_id, points)

    # ------------------------------------------------------------------ metrics
    def log_metrics(self, run_id: str, points: Sequence[MetricPoint]) -> int:
        """Write a batch (checked already by the client, checked again here); returns its size."""
        for p in points:
            check_metric(p.key, p.value, p.step)
        if not points:
            return 0
        try:
            with self.engine.begin() as conn:
                self._write_points(conn, run_id, points)
        except sa_exc.IntegrityError:
            # The only constraint a checked point can break is the reference to its run.
            with self.read_engine.connect() as conn:
                self._require_run(conn, run_id)
            raise
        return len(points)

    def _write_points(self, conn: Any, run_id: str, points: Sequence[MetricPoint]) -> None:
        """Upsert checked points and move ``latest_metrics`` forward, in ``conn``'s transaction.
        A run that does not exist fails the foreign key (no SELECT first)."""
        if not points:
            return
        latest: dict[str, MetricPoint] = {}
        for p in points:  # the last point of the highest step wins within a batch
            cur = latest.get(p.key)
            if cur is None or p.step >= cur.step:
                latest[p.key] = p
        rows = [(run_id, p.key, p.step, p.ts, p.value) for p in points]
        sql = self._point_sql()
        for i in range(0, len(rows), SQL_CHUNK):
            conn.exec_driver_sql(sql[0], rows[i : i + SQL_CHUNK])
        conn.exec_driver_sql(sql[1], [(run_id, k, p.step, p.value) for k, p in latest.items()])

    def _marks(self, sql: str) -> str:
        """``sql`` written with ``?`` placeholders, in the driver's parameter style."""
        return sql if self.dialect == "sqlite" else sql.replace("?", "%s")

    def _point_sql(self) -> tuple[str, str]:
        """The two upserts, in the driver's parameter style. The driver's executemany straight
        away: per-row statement building in SQLAlchemy would cost more than the database's
        insert (values are checked before, and are bound parameters, never SQL text)."""
        mark = "?" if self.dialect == "sqlite" else "%s"
        return (
            f"INSERT INTO metrics (run_id, key, step, ts, value) VALUES ({', '.join([mark] * 5)})"
            " ON CONFLICT (run_id, key, step) DO UPDATE SET value = excluded.value,"
            " ts = excluded.ts",
            f"INSERT INTO latest_metrics (run_id, key, step, value) VALUES "
            f"({', '.join([mark] * 4)}) ON CONFLICT (run_id, key) DO UPDATE SET"
            " step = excluded.step, value = excluded.value"
            " WHERE excluded.step >= latest_metrics.step",
        )

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float, float]]:
        """[(step, value, ts)] in step order."""
        check_key(key, "metric name")
        with self.read_engine.connect() as conn:
            rows = conn.execute(
                select(Metric.step, Metric.value, Metric.ts)
                .where(Metric.run_id == run_id, Metric.key == key)
                .order_by(Metric.step)
            )
            return [tuple(r) for r in rows]  # type: ignore[misc]

    def metric_keys(self, run_id: str) -> list[str]:
        with self.read_engine.connect() as conn:
            return list(
                conn.scalars(
                    select(LatestMetric.key)
                    .where(LatestMetric.run_id == run_id)
                    .order_by(LatestMetric.key)
                )
            )

    # ------------------------------------------------------------------ reading runs
    def get_run(self, run_id: str, *, include_deleted: bool = False) -> RunInfo:
        runs = self.get_runs([run_id])
        if not runs or (runs[0].deleted_at is not None and not include_deleted):
            raise NotFoundError(f"no run with id {run_id!r}")
        return runs[0]

    def get_runs(self, run_ids: Sequence[str]) -> list[RunInfo]:
        """Runs with params, tags and latest metrics, in the order of ``run_ids``.

        Two statements per chunk of ids whatever the page holds: the runs, then their params,
        tags and latest metrics together (a UNION ALL), rows read as plain tuples. A search
        page spends most of its time here, so statements and per-row work are kept few."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return []
        by_id: dict[str, RunInfo] = {}
        with self.read_engine.connect() as conn:
            for i in range(0, len(ids), GET_RUNS_CHUNK):
                chunk = {"ids": ids[i : i + GET_RUNS_CHUNK]}
                for r in conn.execute(_RUNS_BY_ID, chunk).all():
                    rid, _pid, name, status, created, ended, commit, env, deleted, project = r
                    by_id[rid] = RunInfo(
                        id=rid,
                        project=project,
                        name=name,
                        status=status,
                        created_at=created,
                        ended_at=ended,
                        git_commit=commit,
                        environment=None if env is None else json.loads(env),
                        deleted_at=deleted,
                    )
                for rid, what, key, kind, num, text in conn.execute(_DETAILS_BY_RUN, chunk).all():
                    run = by_id.get(rid)
                    if run is None:  # a run inserted between the two statements
                        continue
                    if what == 0:
                        run.params[key] = _param_value(kind, num, text)
                    elif what == 1:
                        run.tags[key] = text
                    else:
                        run.metrics[key] = num
        return [by_id[i] for i in run_ids if i in by_id]

    def run_project(self, run_id: str) -> str:
        if not _is_run_id(run_id):
            raise NotFoundError(f"no run with id {_clip(str(run_id))}")
        with self.read_engine.connect() as conn:
            name = conn.scalar(
                select(Project.name).join(Run, Run.project_id == Project.id).where(Run.id == run_id)
            )
        if name is None:
            raise NotFoundError(f"no run with id {run_id!r}")
        return name

    def count_runs(self, project: str | None = None) -> int:
        stmt = select(func.count()).select_from(Run).where(Run.deleted_at.is_(None))
        if project is not None:
            stmt = stmt.where(Run.project_id == self.project_id(project, create=False))
        with self.read_engine.connect() as conn:
            return int(conn.scalar(stmt) or 0)

    # ------------------------------------------------------------------ artifacts
    def begin_upload(self, sha256: str) -> int:
        """Record the intent to upload ``sha256`` (see schema.py, ``uploads``)."""
        with self.engine.begin() as conn:
            return int(
                conn.execute(
                    insert(Upload).values(sha256=sha256, started_at=time.time())
                ).inserted_primary_key[0]  # type: ignore[index]
            )

    def add_artifact(
        self,
        run_id: str,
        name: str,
        *,
        sha256: str,
        size: int,
        uri: str,
        kind: str = "file",
        promoted: bool = False,
        upload_id: int | None = None,
    ) -> ArtifactRef:
        """Commit the reference (and drop the upload intent) once the bytes are stored."""
        check_text(name, "artifact name")
        check_artifact_kind(kind)
        now = time.time()
        with self.engine.begin() as conn:
            run = self._require_run(conn, run_id)
            if run.deleted_at is not None:
                raise TrackingError(f"run {run_id} is deleted; artifacts cannot be added")
            try:
                with conn.begin_nested():
                    conn.execute(
                        insert(Artifact),
                        {
                            "run_id": run_id,
                            "name": name,
                            "sha256": sha256,
                            "size": size,
                            "uri": uri,
                            "kind": kind,
                            "promoted": promoted,
                            "created_at": now,
                            "deleted_at": None,
                        },
                    )
            except sa_exc.IntegrityError:
                raise IntegrityError(
                    f"run {run_id} already has an artifact named {name!r}; artifacts are "
                    "immutable, log the new content under another name"
                ) from None
            if upload_id is not None:
                conn.execute(delete(Upload).where(Upload.id == upload_id))
        return ArtifactRef(run_id, name, sha256, size, uri, kind, promoted, now)

    def artifacts(self, run_id: str, *, include_deleted: bool = False) -> list[ArtifactRef]:
        stmt = select(Artifact.__table__).where(Artifact.run_id == run_id).order_by(Artifact.name)
        if not include_deleted:
            stmt = stmt.where(Artifact.deleted_at.is_(None))
        with self.read_engine.connect() as conn:
            return [_ref(a) for a in conn.execute(stmt)]

    def artifact(self, run_id: str, name: str) -> ArtifactRef:
        check_text(name, "artifact name")
        with self.read_engine.connect() as conn:
            a = conn.execute(
                select(Artifact.__table__).where(
                    Artifact.run_id == run_id,
                    Artifact.name == name,
                    Artifact.deleted_at.is_(None),
                )
            ).first()
        if a is None:
            raise NotFoundError(f"run {run_id} has no artifact named {name!r}")
        return _ref(a)

    def set_promoted(self, run_id: str, name: str, promoted: bool = True) -> None:
        with self.engine.begin() as conn:
            n = conn.execute(
                update(Artifact)
                .where(Artifact.run_id == run_id, Artifact.name == name)
                .values(promoted=promoted)
            ).rowcount
        if not n:
            raise NotFoundError(f"run {run_id} has no artifact named {name!r}")

    def referenced_hashes(self, *, upload_grace_s: float) -> set[str]:
        """Hashes collection must keep: any artifact row (live or soft-deleted, which can still
        be restored) and any upload intent younger than the grace period."""
        with self.read_engine.connect() as conn:
            refs = set(conn.scalars(select(Artifact.sha256).distinct()))
            refs |= set(
                conn.scalars(
                    select(Upload.sha256).where(Upload.started_at > time.time() - upload_grace_s)
                )
            )
        return refs

    def expire_uploads(self, *, upload_grace_s: float) -> int:
        with self.engine.begin() as conn:
            return conn.execute(
                delete(Upload).where(Upload.started_at <= time.time() - upload_grace_s)
            ).rowcount

    # ------------------------------------------------------------------ soft delete / purge
    def soft_delete(
        self, *, run_ids: Iterable[str] = (), artifacts: Iterable[tuple[str, str]] = ()
    ) -> None:
        now = time.time()
        run_ids, artifacts = list(run_ids), list(artifacts)
        with self.engine.begin() as conn:
            for i in range(0, len(run_ids), 500):
                chunk = run_ids[i : i + 500]
                conn.execute(
                    update(Run)
                    .where(Run.id.in_(chunk), Run.deleted_at.is_(None))
                    .values(deleted_at=now)
                )
                conn.execute(
                    update(Artifact)
                    .where(
                        Artifact.run_id.in_(chunk),
                        Artifact.deleted_at.is_(None),
                        Artifact.promoted.is_(False),
                    )
                    .values(deleted_at=now)
                )
            for run_id, name in artifacts:
                conn.execute(
                    update(Artifact)
                    .where(
                        Artifact.run_id == run_id,
                        Artifact.name == name,
                        Artifact.deleted_at.is_(None),
                    )
                    .values(deleted_at=now)
                )

    def restore(self, run_id: str) -> None:
        """Undo a soft delete (before collection purged the rows)."""
        with self.engine.begin() as conn:
            run = self._require_run(conn, run_id)
            conn.execute(
                update(Artifact)
                .where(Artifact.run_id == run_id, Artifact.deleted_at.is_not(None))
                .values(deleted_at=None)
            )
            if run.deleted_at is not None:
                conn.execute(update(Run).where(Run.id == run_id).values(deleted_at=None))

    def purge_deleted(self, *, older_than: float) -> tuple[int, int]:
        """Hard-delete artifact rows and runs soft-deleted before ``older_than`` (UNIX s).
        Returns (artifact rows, runs). Bytes are freed afterwards by collection."""
        with self.engine.begin() as conn:
            old_runs = list(
                conn.scalars(
                    select(Run.id).where(Run.deleted_at.is_not(None), Run.deleted_at < older_than)
                )
            )
            n_art = conn.execute(
                delete(Artifact).where(
                    Artifact.deleted_at.is_not(None), Artifact.deleted_at < older_than
                )
            ).rowcount
            removed = 0
            for i in range(0, len(old_runs), 500):
                chunk = old_runs[i : i + 500]
                # Promoted artifacts of a deleted run keep their run row alive.
                kept = set(conn.scalars(select(Artifact.run_id).where(Artifact.run_id.in_(chunk))))
                gone = [r for r in chunk if r not in kept]
                for table in (Metric, LatestMetric, Param, Tag):
                    conn.execute(delete(table).where(table.run_id.in_(gone)))
                conn.execute(
                    delete(LineageEdge).where(
                        LineageEdge.src.in_([f"run:{r}" for r in gone])
                        | LineageEdge.dst.in_([f"run:{r}" for r in gone])
                    )
                )
                conn.execute(delete(Run).where(Run.id.in_(gone)))
                removed += len(gone)
        return n_art, removed

    # ------------------------------------------------------------------ lineage edges
    def add_edges(self, edges: Iterable[tuple[str, str, str]]) -> None:
        from reference_impls.tracking.lineage import check_node, check_relation

        rows = []
        for src, dst, relation in edges:
            check_node(src)
            check_node(dst)
            check_relation(relation)
            if src == dst:
                raise TrackingError(f"a lineage edge from {src!r} to itself is not allowed")
            rows.append({"src": src, "dst": dst, "relation": relation, "created_at": time.time()})
        if not rows:
            return
        stmt = _insert(self.engine, LineageEdge).on_conflict_do_nothing(
            index_elements=["src", "dst"]
        )
        with self.engine.begin() as conn:
            conn.execute(stmt, rows)

    # ------------------------------------------------------------------ retention inputs
    def retention_inputs(self, project: str | None = None) -> tuple[list[Any], list[ArtifactRef]]:
        """(runs as (id, project, created_at, deleted_at), live artifact refs) for planning."""
        stmt = select(Run.id, Project.name, Run.created_at, Run.deleted_at).join(
            Project, Project.id == Run.project_id
        )
        astmt = select(Artifact.__table__).where(Artifact.deleted_at.is_(None))
        if project is not None:
            stmt = stmt.where(Project.name == project)
            astmt = astmt.join(Run, Run.id == Artifact.run_id).where(
                Run.project_id == self.project_id(project, create=False)
            )
        with self.read_engine.connect() as conn:
            runs = [tuple(r) for r in conn.execute(stmt)]
            arts = [_ref(a) for a in conn.execute(astmt)]
        return runs, arts

    def all_live_hash_counts(self) -> dict[str, int]:
        """sha256 -> number of artifact rows (live or soft-deleted) referencing it."""
        with self.read_engine.connect() as conn:
            return {
                sha: int(n)
                for sha, n in conn.execute(
                    select(Artifact.sha256, func.count()).group_by(Artifact.sha256)
                )
            }

    def sizes_of(self, hashes: Iterable[str]) -> dict[str, int]:
        hs = list(hashes)
        out: dict[str, int] = {}
        with self.read_engine.connect() as conn:
            for i in range(0, len(hs), 500):
                out.update(
                    conn.execute(
                        select(Artifact.sha256, func.max(Artifact.size))
                        .where(Artifact.sha256.in_(hs[i : i + 500]))
                        .group_by(Artifact.sha256)
                    ).all()
                )
        return out


def _ref(a: Any) -> ArtifactRef:
    return ArtifactRef(
        a.run_id, a.name, a.sha256, a.size, a.uri, a.kind, a.promoted, a.created_at, a.deleted_at
    )
