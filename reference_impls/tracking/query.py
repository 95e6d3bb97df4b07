"""The search language: a small, safe filter over runs, parsed to parameterized SQL.

Grammar (keywords are case-insensitive)::

    query    := [expr] [ORDER BY order ("," order)*] [LIMIT integer]
    expr     := conj (OR conj)*
    conj     := unary (AND unary)*
    unary    := NOT unary | "(" expr ")" | atom
    atom     := field op value
              | field BETWEEN value AND value
              | field IN "(" value ("," value)* ")"
    order    := field [ASC | DESC]
    field    := params.NAME | metrics.NAME | tags.NAME | created | ended | status | name | id
    op       := "=" | "!=" | "<" | "<=" | ">" | ">="
    value    := number | 'text' (a quote inside is doubled: 'it''s') | true | false
              | relative time: -30d, -12h, -15m, -45s, -2w (that long before now)

Types are checked, not coerced: ``metrics.*`` compare with numbers; ``params.*`` compare with
numbers (numeric params), text (text params) or true/false (boolean params); ``tags.*`` with
text; ``created``/``ended`` with a relative time, a UNIX time in seconds or an ISO date text
('2026-11-30' or '2026-11-30T12:00:00', UTC); ``status`` with a run status. A metric
compares its latest value (the highest step). A run without the field never satisfies a
comparison on it (``!=`` included), so ``not`` of that comparison does include it.

The text never reaches SQL: it becomes a syntax tree (:func:`parse`, querylang.py, with the
printer), the tree becomes
SQLAlchemy expressions whose values are bound parameters (:func:`compile_query`), and
:func:`to_text` prints a tree back in canonical form (``parse(to_text(q)) == q``).
:func:`matches` evaluates a filter on a :class:`RunInfo` in Python: the tests' oracle.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select, and_, exists, not_, or_, select
from sqlalchemy.orm import aliased

from reference_impls.tracking.errors import FilterError
from reference_impls.tracking.metadata import MetadataStore, RunInfo
from reference_impls.tracking.querylang import (
    DEFAULT_LIMIT,
    And,
    Between,
    Compare,
    Expr,
    Field,
    In,
    Not,
    Or,
    Order,
    Query,
    RelTime,
    Value,
    _check_limit,
    _iso_time,
    _kind,
    parse,
    parse_order,
    to_text,
)
from reference_impls.tracking.schema import LatestMetric, Param, Run, Tag

__all__ = [
    "And",
    "Between",
    "Compare",
    "Field",
    "In",
    "Not",
    "Or",
    "Order",
    "Query",
    "RelTime",
    "SearchPage",
    "compile_query",
    "matches",
    "parse",
    "search_runs",
    "to_text",
]


# ----------------------------------------------------------------------------- evaluation
def _time_value(v: Value, now: float, label: str) -> float:
    if isinstance(v, RelTime):
        return now - v.seconds
    if isinstance(v, str):
        return _iso_time(v, label)
    return float(v)


def _cmp(a: Any, op: str, b: Any) -> Any:
    """``a op b`` for Python values (a bool) and for SQL columns (an expression)."""
    return {
        "=": a == b,
        "!=": a != b,
        "<": a < b,
        "<=": a <= b,
        ">": a > b,
        ">=": a >= b,
    }[op]


def _lookup(f: Field, run: RunInfo, kind: str) -> Any:
    """The run's value of ``f`` for a comparison with a value of ``kind``; None if absent or
    of another type (a numeric param never equals a text)."""
    if f.scope == "metrics":
        return run.metrics.get(f.name)
    if f.scope == "tags":
        return run.tags.get(f.name)
    if f.scope == "params":
        if f.name not in run.params:
            return None
        v = run.params[f.name]
        if kind == "bool":
            return v if isinstance(v, bool) else None
        if kind == "num":
            return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
        return v if isinstance(v, str) else None
    if f.name == "created":
        return run.created_at
    if f.name == "ended":
        return run.ended_at
    return {"status": run.status, "name": run.name, "id": run.id}[f.name]


def _operands(e: Compare | Between | In) -> tuple[Value, ...]:
    """The values an atom compares with, in order."""
    if isinstance(e, Compare):
        return (e.value,)
    if isinstance(e, Between):
        return (e.low, e.high)
    return e.values


def matches(e: Expr | None, run: RunInfo, now: float) -> bool:
    """Evaluate a filter on one run in Python (the same semantics as the SQL)."""
    if e is None:
        return True
    if isinstance(e, And):
        return all(matches(i, run, now) for i in e.items)
    if isinstance(e, Or):
        return any(matches(i, run, now) for i in e.items)
    if isinstance(e, Not):
        return not matches(e.item, run, now)
    f = e.field
    vals = _operands(e)
    kind = _kind(vals[0])
    is_time = f.scope == "attr" and f.name in ("created", "ended")
    if is_time:
        vals = tuple(_time_value(v, now, f.name) for v in vals)
        kind = "num"
    elif kind == "num":
        vals = tuple(float(v) for v in vals)  # type: ignore[arg-type]
    have = _lookup(f, run, kind)
    if have is None:
        return False
    if isinstance(e, Compare):
        return bool(_cmp(have, e.op, vals[0]))
    if isinstance(e, Between):
        return bool(vals[0] <= have <= vals[1])
    return have in vals


# ----------------------------------------------------------------------------- SQL
def _sql_values(f: Field, vals: tuple[Value, ...], now: float) -> tuple[str, tuple[Any, ...]]:
    kind = _kind(vals[0])
    if f.scope == "attr" and f.name in ("created", "ended"):
        return "num", tuple(_time_value(v, now, f.name) for v in vals)
    if kind == "num":
        return kind, tuple(float(v) for v in vals)  # type: ignore[arg-type]
    if kind == "bool":
        return kind, tuple(1.0 if v else 0.0 for v in vals)
    return kind, vals


def _apply(col: Any, e: Compare | Between | In, vals: tuple[Any, ...]) -> Any:
    if isinstance(e, Compare):
        return _cmp(col, e.op, vals[0])
    if isinstance(e, Between):
        return col.between(vals[0], vals[1])
    return col.in_(vals)


def _sql(e: Expr, now: float) -> Any:
    if isinstance(e, And):
        return and_(*(_sql(i, now) for i in e.items))
    if isinstance(e, Or):
        return or_(*(_sql(i, now) for i in e.items))
    if isinstance(e, Not):
        return not_(_sql(e.item, now))
    f = e.field
    raw = _operands(e)
    kind, vals = _sql_values(f, raw, now)
    if f.scope == "metrics":
        return exists().where(
            LatestMetric.run_id == Run.id,
            LatestMetric.key == f.name,
            _apply(LatestMetric.value, e, vals),
        )
    if f.scope == "tags":
        return exists().where(Tag.run_id == Run.id, Tag.key == f.name, _apply(Tag.value, e, vals))
    if f.scope == "params":
        col: Any = Param.str_value if kind == "str" else Param.num_value
        return exists().where(
            Param.run_id == Run.id,
            Param.key == f.name,
            Param.kind == kind,
            _apply(col, e, vals),
        )
    col = {
        "created": Run.created_at,
        "ended": Run.ended_at,
        "status": Run.status,
        "name": Run.name,
        "id": Run.id,
    }[f.name]
    cond = _apply(col, e, vals)
    return and_(col.is_not(None), cond) if f.name == "ended" else cond


@dataclass
class SearchPage:
    runs: list[RunInfo]
    next_page_token: str | None = None
    query: str = ""
    order: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": [r.to_dict() for r in self.runs],
            "next_page_token": self.next_page_token,
            "query": self.query,
        }


def compile_query(
    q: Query, project_id: int, *, now: float, offset: int = 0, limit: int = DEFAULT_LIMIT
) -> Select[Any]:
    """SELECT runs.id ... for ``q`` in one project (values are bound parameters)."""
    stmt = select(Run.id).where(Run.project_id == project_id, Run.deleted_at.is_(None))
    conjuncts = (
        list(q.where.items)
        if isinstance(q.where, And)
        else [q.where]
        if q.where is not None
        else []
    )
    order_cols: list[Any] = []
    # Top-level metric conditions on a metric the order joins: tested on the joined row
    # (conjunct's id -> the alias's value column) instead of a correlated subquery per run.
    on_join: dict[int, Any] = {}
    for n, o in enumerate(q.order):
        f = o.field
        if f.scope == "attr":
            col = {
                "created": Run.created_at,
                "ended": Run.ended_at,
                "status": Run.status,
                "name": Run.name,
                "id": Run.id,
            }[f.name]
            tie = Run.id
            if f.name == "ended":
                order_cols.append(col.is_(None))
        else:
            table = {"metrics": LatestMetric, "tags": Tag, "params": Param}[f.scope]
            alias: Any = aliased(table, name=f"o{n}")
            value = alias.value if f.scope != "params" else alias.num_value
            # A top-level condition on the same metric means every row has it: an inner join
            # lets the database walk the (key, value) index in order and stop at the limit.
            needed = [
                c
                for c in conjuncts
                if isinstance(c, Compare | Between | In) and c.field == f and f.scope == "metrics"
            ]
            on = and_(alias.run_id == Run.id, alias.key == f.name)
            if f.scope == "params":
                # A param is a number (or boolean, 0/1) or a text, per run: numbers order
                # before texts, each among themselves, and runs without it last.
                stmt = stmt.outerjoin(alias, on)
                order_cols += [alias.kind.is_(None), alias.str_value.is_not(None)]
                for c in (alias.num_value, alias.str_value):
                    order_cols.append(c.desc() if o.descending else c.asc())
                if n == len(q.order) - 1:
                    order_cols.append(Run.id.desc() if o.descending else Run.id.asc())
                continue
            if needed:
                stmt = stmt.join(alias, on)
                col = value
                for atom in needed:
                    on_join.setdefault(id(atom), value)
            else:
                stmt = stmt.outerjoin(alias, on)
                col = value
                order_cols.append(value.is_(None))
            tie = alias.run_id if needed else Run.id
        order_cols.append(col.desc() if o.descending else col.asc())
        if n == len(q.order) - 1:
            order_cols.append(tie.desc() if o.descending else tie.asc())
    if not q.order:
        order_cols = [Run.created_at.desc(), Run.id.desc()]
    if conjuncts:
        conds = []
        for c in conjuncts:
            if id(c) in on_join:
                assert isinstance(c, Compare | Between | In)
                _, vals = _sql_values(c.field, _operands(c), now)
                conds.append(_apply(on_join[id(c)], c, vals))
            else:
                conds.append(_sql(c, now))
        stmt = stmt.where(*conds)
    return stmt.order_by(*order_cols).offset(offset).limit(limit)


MAX_OFFSET = 2**53  # far beyond any project's runs; within both databases' 64-bit OFFSET


def _digest(q: Query) -> str:
    return hashlib.sha256(to_text(Query(q.where, q.order, q.limit)).encode()).hexdigest()[:16]


def _token(q: Query, offset: int) -> str:
    raw = json.dumps({"o": offset, "q": _digest(q)}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _read_token(token: str, q: Query) -> int:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        offset, digest = int(raw["o"]), str(raw["q"])
    except Exception:
        raise FilterError(f"page token {token[:40]!r} is not one this server gave out") from None
    if digest != _digest(q):
        raise FilterError("page token belongs to a different query; start again without it")
    if not 0 <= offset <= MAX_OFFSET:
        # Edited by hand: an offset past a 64-bit integer overflows both drivers.
        raise FilterError(f"page token offset {offset} is out of range (0 to {MAX_OFFSET})")
    return offset


def search_runs(
    meta: MetadataStore,
    project: str,
    query: str | Query = "",
    *,
    order_by: str | None = None,
    limit: int | None = None,
    page_token: str | None = None,
    now: float | None = None,
) -> SearchPage:
    """One page of a project's runs matching ``query`` (text or a parsed Query)."""
    q = parse(query) if isinstance(query, str) else query
    if order_by:
        if q.order:
            raise FilterError("ORDER BY is given twice: in the query and as order_by")
        q = Query(q.where, parse_order(order_by), q.limit)
    if limit is not None:
        if q.limit is not None and q.limit != limit:
            raise FilterError("LIMIT is given twice: in the query and as limit")
        q = Query(q.where, q.order, _check_limit(int(limit)))
    size = q.limit or DEFAULT_LIMIT
    offset = _read_token(page_token, q) if page_token else 0
    pid = meta.project_id(project, create=False)
    stmt = compile_query(
        q, pid, now=time.time() if now is None else now, offset=offset, limit=size + 1
    )
    with meta.read_engine.connect() as conn:
        ids = list(conn.scalars(stmt))
    more = len(ids) > size
    ids = ids[:size]
    return SearchPage(
        runs=meta.get_runs(ids),
        next_page_token=_token(q, offset + size) if more else None,
        query=to_text(q),
    )
