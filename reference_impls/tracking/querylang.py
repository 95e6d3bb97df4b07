"""The search language's text side: its syntax tree, parser and printer (query.py runs it).

The grammar and the typing rules are in query.py's docstring. :func:`parse` turns a filter's
text into a tree of frozen dataclasses (checking sizes, field names and value types, so a bad
filter fails with a :class:`FilterError` naming it before any SQL exists); :func:`to_text`
prints a tree back in canonical form (``parse(to_text(q)) == q``). The tree is what the SQL
compiler and the Python oracle (:func:`~reference_impls.tracking.query.matches`) evaluate.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass
from typing import Any, Union

from reference_impls.tracking.errors import FilterError
from reference_impls.tracking.metadata import KEY_RE, RunStatus

__all__ = [
    "And",
    "Between",
    "Compare",
    "Expr",
    "Field",
    "In",
    "Not",
    "Or",
    "Order",
    "Query",
    "RelTime",
    "Value",
    "parse",
    "parse_order",
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
        bad = next((i for i, ch in enumerate(text) if "\ud800" <= ch <= "\udfff"), None)
        if bad is not None:  # not UTF-8 encodable: every driver fails on it
            raise FilterError(
                f"filter contains {text[bad]!r} at position {bad}, a lone surrogate that is "
                "not Unicode text",
                bad,
            )
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
