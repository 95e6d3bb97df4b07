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

The text never reaches SQL: it becomes a syntax tree (:func:`parse`), the tree becomes
SQLAlchemy expressions whose values are bound parameters (:func:`compile_query`), and
:func:`to_text` prints a tree back in canonical form (``parse(to_text(q)) == q``).
:func:`matches` evaluates a filter on a :class:`RunInfo` in Python: the tests' oracle.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Union

from sqlalchemy import Select, and_, exists, not_, or_, select
from sqlalchemy.orm import aliased

from reference_impls.tracking.errors import FilterError
from reference_impls.tracking.metadata import KEY_RE, MetadataStore, RunInfo, RunStatus
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

MAX_QUERY_CHARS = 10_000
MAX_ATOMS = 200
MAX_DEPTH = 40
MAX_LIMIT = 10_000
DEFAULT_LIMIT = 100
ATTRS = ("created", "ended", "status", "name", "id")
SCOPES = ("params", "metrics", "tags")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
OPS = ("=", "!=", "<", "<=", ">", ">=")


# ----------------------------------------------------------------------------- syntax tree
@dataclass(frozen=True)
class RelTime:
    """``-amount unit`` before now."""

    amount: int
    unit: str

    @property
    def seconds(self) -> int:
        return self.amount * UNITS[self.unit]


Value = Union[float, int, str, bool, RelTime]  # noqa: UP007 - a runtime alias


@dataclass(frozen=True)
class Field:
    scope: str  # params | metrics | tags | attr
    name: str


@dataclass(frozen=True)
class Compare:
    field: Field
    op: str
    value: Value


@dataclass(frozen=True)
class Between:
    field: Field
    low: Value
    high: Value


@dataclass(frozen=True)
class In:
    field: Field
    values: tuple[Value, ...]


@dataclass(frozen=True)
class Not:
    item: Expr


@dataclass(frozen=True)
class And:
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Or:
    items: tuple[Expr, ...]


Expr = Union[Compare, Between, In, "Not", "And", "Or"]  # noqa: UP007 - forward refs


@dataclass(frozen=True)
class Order:
    field: Field
    descending: bool = False


@dataclass(frozen=True)
class Query:
    where: Expr | None = None
    order: tuple[Order, ...] = ()
    limit: int | None = None


# ----------------------------------------------------------------------------- tokenizer
_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<rel>-\d+[smhdw](?![A-Za-z0-9_.]))
  | (?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![A-Za-z_]))
  | (?P<str>'(?:[^']|'')*')
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.\-/]*)
  | (?P<op><=|>=|!=|<>|==|=|<|>)
  | (?P<punct>[(),])
    """,
    re.VERBOSE,
)
KEYWORDS = {"and", "or", "not", "between", "in", "order", "by", "asc", "desc", "limit"}


@dataclass
class _Tok:
    kind: str
    text: str
    pos: int
    value: Any = None


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None and text[pos] == "'":
            raise FilterError(f"unterminated text starting at position {pos}", pos)
        if m is None:
            raise FilterError(
                f"unexpected character {text[pos]!r} at position {pos}: {_excerpt(text, pos)}",
                pos,
            )
        kind = m.lastgroup
        assert kind is not None
        raw = m.group()
        if kind != "ws":
            tok = _Tok(kind, raw, pos)
            if kind == "ident" and raw.lower() in KEYWORDS | {"true", "false"}:
                tok.kind = "kw"
                tok.text = raw.lower()
            toks.append(tok)
        pos = m.end()
    return toks


def _excerpt(text: str, pos: int) -> str:
    return repr(text[max(0, pos - 20) : pos + 20])


class _Parser:
    def __init__(self, text: str) -> None:
        if not isinstance(text, str):
            raise FilterError(f"a filter is text, got {type(text).__name__}")
        if len(text) > MAX_QUERY_CHARS:
            raise FilterError(
                f"filter is {len(text)} characters long; the limit is {MAX_QUERY_CHARS}"
            )
        if "\x00" in text:
            raise FilterError("filter contains a NUL character")
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0
        self.atoms = 0

    # helpers
    def peek(self, k: int = 0) -> _Tok | None:
        return self.toks[self.i + k] if self.i + k < len(self.toks) else None

    def at_kw(self, *words: str) -> bool:
        t = self.peek()
        return t is not None and t.kind == "kw" and t.text in words

    def expect_kw(self, word: str) -> None:
        if not self.at_kw(word):
            self.fail(f"expected {word.upper()}")
        self.i += 1

    def expect_punct(self, p: str) -> None:
        t = self.peek()
        if t is None or t.kind != "punct" or t.text != p:
            self.fail(f"expected {p!r}")
        self.i += 1

    def fail(self, what: str) -> None:
        t = self.peek()
        if t is None:
            raise FilterError(f"{what} at the end of the filter {self.text!r}", len(self.text))
        raise FilterError(
            f"{what} at position {t.pos}, found {t.text!r}: {_excerpt(self.text, t.pos)}", t.pos
        )

    # grammar
    def query(self) -> Query:
        where = None
        if self.peek() is not None and not self.at_kw("order", "limit"):
            where = self.expr(0)
        order: list[Order] = []
        if self.at_kw("order"):
            self.i += 1
            self.expect_kw("by")
            order.append(self.order())
            while (t := self.peek()) is not None and t.kind == "punct" and t.text == ",":
                self.i += 1
                order.append(self.order())
        limit = None
        if self.at_kw("limit"):
            self.i += 1
            t = self.peek()
            if t is None or t.kind != "num" or not re.fullmatch(r"\d+", t.text):
                self.fail("expected a whole number after LIMIT")
                raise AssertionError  # unreachable
            limit = _check_limit(int(t.text))
            self.i += 1
        if self.peek() is not None:
            self.fail("expected AND, OR, ORDER BY, LIMIT or the end")
        return Query(where, tuple(order), limit)

    def order(self) -> Order:
        f = self.field()
        desc = False
        if self.at_kw("asc", "desc"):
            desc = self.peek().text == "desc"  # type: ignore[union-attr]
            self.i += 1
        return Order(f, desc)

    def expr(self, depth: int) -> Expr:
        if depth > MAX_DEPTH:
            self.fail(f"filter nests deeper than {MAX_DEPTH} levels")
        items = [self.conj(depth)]
        while self.at_kw("or"):
            self.i += 1
            items.append(self.conj(depth))
        return items[0] if len(items) == 1 else Or(_flatten(Or, items))

    def conj(self, depth: int) -> Expr:
        items = [self.unary(depth)]
        while self.at_kw("and"):
            self.i += 1
            items.append(self.unary(depth))
        return items[0] if len(items) == 1 else And(_flatten(And, items))

    def unary(self, depth: int) -> Expr:
        if depth > MAX_DEPTH:
            self.fail(f"filter nests deeper than {MAX_DEPTH} levels")
        if self.at_kw("not"):
            self.i += 1
            return Not(self.unary(depth + 1))
        t = self.peek()
        if t is not None and t.kind == "punct" and t.text == "(":
            self.i += 1
            e = self.expr(depth + 1)
            self.expect_punct(")")
            return e
        return self.atom()

    def field(self) -> Field:
        t = self.peek()
        if t is None or t.kind != "ident":
            self.fail(
                "expected a field (params.NAME, metrics.NAME, tags.NAME, created, ended, "
                "status, name, id)"
            )
            raise AssertionError
        self.i += 1
        return _field(t.text, t.pos)

    def atom(self) -> Expr:
        self.atoms += 1
        if self.atoms > MAX_ATOMS:
            self.fail(f"filter has more than {MAX_ATOMS} comparisons")
        f = self.field()
        if self.at_kw("between"):
            self.i += 1
            low = self.value()
            self.expect_kw("and")
            high = self.value()
            return _typed(Between(f, low, high))
        if self.at_kw("in"):
            self.i += 1
            self.expect_punct("(")
            values = [self.value()]
            while (t := self.peek()) is not None and t.kind == "punct" and t.text == ",":
                self.i += 1
                values.append(self.value())
            self.expect_punct(")")
            return _typed(In(f, tuple(values)))
        t = self.peek()
        if t is None or t.kind != "op":
            self.fail(
                f"expected a comparison (=, !=, <, <=, >, >=, BETWEEN, IN) after {f.scope}.{f.name}"
                if f.scope != "attr"
                else f"expected a comparison after {f.name}"
            )
            raise AssertionError
        self.i += 1
        op = {"==": "=", "<>": "!="}.get(t.text, t.text)
        return _typed(Compare(f, op, self.value()))

    def value(self) -> Value:
        t = self.peek()
        if t is None:
            self.fail("expected a value")
            raise AssertionError
        self.i += 1
        if t.kind == "num":
            if re.fullmatch(r"[-+]?\d+", t.text) and abs(int(t.text)) <= 2**53:
                return int(t.text)
            v = float(t.text)
            if not math.isfinite(v):
                raise FilterError(f"number {t.text} at position {t.pos} is out of range", t.pos)
            return v
        if t.kind == "str":
            return t.text[1:-1].replace("''", "'")
        if t.kind == "rel":
            return RelTime(int(t.text[1:-1]), t.text[-1])
        if t.kind == "kw" and t.text in ("true", "false"):
            return t.text == "true"
        self.i -= 1
        self.fail("expected a value (a number, 'text', true, false or a time like -30d)")
        raise AssertionError


def _flatten(cls: type, items: list[Expr]) -> tuple[Expr, ...]:
    out: list[Expr] = []
    for it in items:
        out.extend(it.items if isinstance(it, And | Or) and isinstance(it, cls) else (it,))
    return tuple(out)


def _field(text: str, pos: int | None = None) -> Field:
    if "." in text:
        scope, name = text.split(".", 1)
        if scope in SCOPES and KEY_RE.fullmatch(name):
            return Field(scope, name)
    elif text in ATTRS:
        return Field("attr", text)
    raise FilterError(
        f"unknown field {text!r}"
        + (f" at position {pos}" if pos is not None else "")
        + ": fields are params.NAME, metrics.NAME, tags.NAME, created, ended, status, name, id",
        pos,
    )


def _check_limit(n: int) -> int:
    if not 1 <= n <= MAX_LIMIT:
        raise FilterError(f"limit must be between 1 and {MAX_LIMIT}, got {n}")
    return n


def _kind(v: Value) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "num"
    if isinstance(v, RelTime):
        return "rel"
    return "str"


def _typed(atom: Compare | Between | In) -> Expr:
    """Type-check an atom (see the module docstring); returns it unchanged."""
    f = atom.field
    values: tuple[Value, ...]
    if isinstance(atom, Compare):
        values = (atom.value,)
    elif isinstance(atom, Between):
        values = (atom.low, atom.high)
    else:
        values = atom.values
    kinds = {_kind(v) for v in values}
    label = f"{f.scope}.{f.name}" if f.scope != "attr" else f.name
    ordered = isinstance(atom, Between) or (
        isinstance(atom, Compare) and atom.op not in ("=", "!=")
    )

    def bad(why: str) -> FilterError:
        return FilterError(f"{label}: {why}")

    if len(kinds) > 1 and not (f.scope == "attr" and kinds <= {"num", "rel", "str"}):
        raise bad(f"values of different types {sorted(kinds)} in one comparison")
    kind = kinds.pop() if len(kinds) == 1 else "num"
    if f.scope == "metrics" and kind != "num":
        raise bad("metrics are numbers; compare with a number, e.g. metrics.acc > 0.9")
    if f.scope == "tags" and kind != "str":
        raise bad("tags are text; quote the value, e.g. tags.team = 'nlp'")
    if f.scope == "params" and kind == "rel":
        raise bad("a relative time compares only with created or ended")
    if kind == "bool" and ordered:
        raise bad("true/false compare only with = and !=")
    if f.scope == "attr":
        if f.name in ("created", "ended"):
            if kind == "bool":
                raise bad("compare times with -30d, a UNIX time or an ISO date '2026-11-30'")
            for v in values:
                if isinstance(v, str):
                    _iso_time(v, label)
        elif kind != "str":
            raise bad("compare with quoted text")
        if f.name == "status":
            for v in values:
                if v not in tuple(RunStatus):
                    raise bad(f"unknown status {v!r}; one of {', '.join(RunStatus)}")
    return atom


def _iso_time(text: str, label: str) -> float:
    try:
        d = dt.datetime.fromisoformat(text)
    except ValueError:
        raise FilterError(
            f"{label}: {text!r} is not an ISO date; write '2026-11-30' or '2026-11-30T12:00:00'"
        ) from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.UTC)
    return d.timestamp()


def parse(text: str) -> Query:
    """Parse a query (filter, ORDER BY, LIMIT); raises FilterError with the position."""
    return _Parser(text).query()


def parse_order(text: str) -> tuple[Order, ...]:
    q = parse("order by " + text)
    return q.order


# ----------------------------------------------------------------------------- printing
def _value_text(v: Value) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, RelTime):
        return f"-{v.amount}{v.unit}"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    return "'" + v.replace("'", "''") + "'"


def _field_text(f: Field) -> str:
    return f.name if f.scope == "attr" else f"{f.scope}.{f.name}"


def _expr_text(e: Expr, parent: str = "") -> str:
    if isinstance(e, Compare):
        return f"{_field_text(e.field)} {e.op} {_value_text(e.value)}"
    if isinstance(e, Between):
        return f"{_field_text(e.field)} between {_value_text(e.low)} and {_value_text(e.high)}"
    if isinstance(e, In):
        return f"{_field_text(e.field)} in ({', '.join(_value_text(v) for v in e.values)})"
    if isinstance(e, Not):
        inner = _expr_text(e.item, "not")
        return f"not {inner}"
    word = "and" if isinstance(e, And) else "or"
    text = f" {word} ".join(_expr_text(i, word) for i in e.items)
    return f"({text})" if parent in ("and", "not") or (parent == "or" and word == "or") else text


def to_text(q: Query | Expr) -> str:
    """Canonical text of a query or filter: ``parse(to_text(q)) == q``."""
    if not isinstance(q, Query):
        return _expr_text(q)
    parts = []
    if q.where is not None:
        parts.append(_expr_text(q.where))
    if q.order:
        parts.append(
            "order by "
            + ", ".join(
                _field_text(o.field) + (" desc" if o.descending else " asc") for o in q.order
            )
        )
    if q.limit is not None:
        parts.append(f"limit {q.limit}")
    return " ".join(parts)


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
                on = and_(on, alias.kind == "num")
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
    if offset < 0:
        raise FilterError("page token has a negative offset")
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
