"""Properties of the search language over generated filters (hypothesis): printing and parsing
round-trip, and the SQL that a filter compiles to selects exactly the runs the Python oracle
(:func:`matches`) selects, in the order the oracle sorts them, on a seeded SQLite store."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_impls.tracking.metadata import MetadataStore, MetricPoint
from reference_impls.tracking.query import (
    And,
    Between,
    Compare,
    Field,
    In,
    Not,
    Or,
    Order,
    Query,
    RelTime,
    matches,
    parse,
    search_runs,
    to_text,
)

OPS = ("=", "!=", "<", "<=", ">", ">=")
NUMBERS = st.one_of(
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
)
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.\-/]{0,12}", fullmatch=True)


def _atoms(field: st.SearchStrategy[Field], values: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(
        st.builds(Compare, field, st.sampled_from(OPS), values),
        st.builds(Between, field, values, values),
        st.builds(In, field, st.lists(values, min_size=1, max_size=3).map(tuple)),
    )


any_atom = st.one_of(
    _atoms(st.builds(Field, st.just("metrics"), NAMES), NUMBERS),
    _atoms(st.builds(Field, st.just("params"), NAMES), NUMBERS),
    _atoms(st.builds(Field, st.just("params"), NAMES), TEXT),
    st.builds(
        Compare,
        st.builds(Field, st.just("params"), NAMES),
        st.sampled_from(("=", "!=")),
        st.booleans(),
    ),
    _atoms(st.builds(Field, st.just("tags"), NAMES), TEXT),
    _atoms(
        st.just(Field("attr", "created")),
        st.one_of(st.builds(RelTime, st.integers(0, 10**6), st.sampled_from("smhdw")), NUMBERS),
    ),
    _atoms(st.sampled_from([Field("attr", "name"), Field("attr", "id")]), TEXT),
)


def _trees(atoms: st.SearchStrategy) -> st.SearchStrategy:
    """Filters in the parser's normal form: And/Or flattened, at least two items each."""

    def extend(children: st.SearchStrategy) -> st.SearchStrategy:
        def flat(cls):
            def build(items):
                out = []
                for it in items:
                    out.extend(it.items if isinstance(it, cls) else (it,))
                return cls(tuple(out))

            return st.lists(children, min_size=2, max_size=3).map(build)

        return st.one_of(st.builds(Not, children), flat(And), flat(Or))

    return st.recursive(atoms, extend, max_leaves=8)


orders = st.lists(
    st.builds(
        Order,
        st.one_of(
            st.builds(Field, st.sampled_from(["metrics", "params", "tags"]), NAMES),
            st.sampled_from(
                [Field("attr", a) for a in ("created", "ended", "status", "name", "id")]
            ),
        ),
        st.booleans(),
    ),
    max_size=2,
).map(tuple)


@settings(max_examples=200, deadline=None)
@given(
    where=st.one_of(st.none(), _trees(any_atom)),
    order=orders,
    limit=st.one_of(st.none(), st.integers(1, 10_000)),
)
def test_printing_then_parsing_gives_back_the_same_query(where, order, limit):
    q = Query(where, order, limit)
    text = to_text(q)
    assert parse(text) == q, text
    assert to_text(parse(text)) == text  # canonical: printing is a fixed point


# ----------------------------------------------------------------------------- SQL vs oracle
N_RUNS = 80
NOW = time.time()
EVERYONE: dict[str, list] = {}  # the store's runs, read once (the store never changes)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetadataStore]:
    """Seeded runs with gaps: some lack a param, a metric or a tag; a few share values."""
    meta = MetadataStore(str(Path(tmp_path_factory.mktemp("oracle")) / "t.db"))
    rng = np.random.default_rng(20261201)
    for i in range(N_RUNS):
        params = {}
        if rng.random() < 0.9:
            params["lr"] = float(rng.choice([1e-4, 3e-4, 1e-3, 3e-3, 1e-2]))
        if rng.random() < 0.8:
            params["opt"] = str(rng.choice(["adam", "sgd", "lamb"]))
        if rng.random() < 0.7:
            params["bn"] = bool(rng.random() < 0.5)
        if rng.random() < 0.7:
            params["layers"] = int(rng.integers(1, 5))
        if rng.random() < 0.1:
            params["lr"] = "auto"  # the same name as text in a few runs
        tags = {"team": str(rng.choice(["nlp", "cv", "rl"]))} if rng.random() < 0.8 else {}
        rid = meta.create_run(
            "p",
            name=f"run-{i % 50:02d}",
            params=params,
            tags=tags,
            created_at=NOW - float(rng.uniform(0, 60)) * 86_400,
        )
        points = []
        for key in ("acc", "loss"):
            if rng.random() < 0.85:
                points.append(
                    MetricPoint(key, int(rng.integers(0, 5)), float(np.round(rng.random(), 2)), NOW)
                )
        meta.log_metrics(rid, points)
        if rng.random() < 0.5:
            meta.end_run(rid, str(rng.choice(["finished", "failed"])))
    yield meta
    meta.close()


def _field_values(field: Field) -> st.SearchStrategy:
    numbers = st.sampled_from([0, 0.25, 0.5, 0.62, 1, 1e-4, 3e-4, 1e-3, 1e-2, 2, 3, -1])
    if field.scope == "metrics":
        return numbers
    if field.scope == "tags":
        return st.sampled_from(["nlp", "cv", "rl", "zzz", ""])
    if field.scope == "params":
        if field.name == "opt":
            return st.sampled_from(["adam", "sgd", "lamb", "b"])
        return st.one_of(numbers, st.sampled_from(["auto", "adam"]))
    if field.name == "created":
        return st.one_of(
            st.builds(RelTime, st.integers(0, 70), st.sampled_from("dh")),
            st.sampled_from(["2026-11-20", "2030-01-01"]),
        )
    if field.name == "status":
        return st.sampled_from(["running", "finished", "failed"])
    return st.sampled_from(["run-07", "run-2", "run-30", "a", "z"])


FIELDS = [
    Field("metrics", "acc"),
    Field("metrics", "loss"),
    Field("metrics", "missing"),
    Field("params", "lr"),
    Field("params", "opt"),
    Field("params", "layers"),
    Field("tags", "team"),
    Field("attr", "created"),
    Field("attr", "status"),
    Field("attr", "name"),
]


@st.composite
def schema_atom(draw):
    field = draw(st.sampled_from(FIELDS + [Field("params", "bn")]))
    if field == Field("params", "bn"):
        return Compare(field, draw(st.sampled_from(("=", "!="))), draw(st.booleans()))
    values = _field_values(field)
    if field.name in ("status",):
        op = draw(st.sampled_from(("=", "!=")))
        return draw(
            st.one_of(
                st.just(Compare(field, op, draw(values))),
                st.builds(In, st.just(field), st.lists(values, min_size=1, max_size=3).map(tuple)),
            )
        )
    first = draw(values)
    same = _kind_filter(first, values)
    kind = draw(st.sampled_from(["cmp", "between", "in"]))
    if kind == "cmp":
        return Compare(field, draw(st.sampled_from(OPS)), first)
    if kind == "between":
        return Between(field, first, draw(same))
    return In(field, (first, *draw(st.lists(same, max_size=2))))


def _kind_filter(first, values):
    def kind(v):
        return (
            "bool"
            if isinstance(v, bool)
            else "num"
            if isinstance(v, int | float)
            else type(v).__name__
        )

    if isinstance(first, RelTime | str) and not isinstance(first, bool):
        return values.filter(lambda v: kind(v) == kind(first) or not isinstance(v, bool))
    return values.filter(lambda v: kind(v) == kind(first))


def _sort_key(run, orders):
    key = []
    for o in orders:
        f = o.field
        if f.scope == "metrics":
            v = run.metrics.get(f.name)
        elif f.scope == "params":
            # Numbers (booleans as 0/1) before texts, each in the order asked; missing last.
            raw = run.params.get(f.name)
            if raw is None:
                key.append((True, 0, 0))
            elif isinstance(raw, str):
                # Descending text: code points negated, and a sentinel above every negated
                # one so that a prefix sorts after its extensions ("ab" before "a").
                key.append((False, 1, (*(-ord(c) for c in raw), 1) if o.descending else raw))
            else:
                key.append((False, 0, -float(raw) if o.descending else float(raw)))
            continue
        elif f.name == "created":
            v = run.created_at
        else:
            v = getattr(run, f.name)
        missing = v is None
        if missing:
            v = 0
        key.append((missing, -v if o.descending and not isinstance(v, str) else v))
    return key


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@given(
    where=st.one_of(st.none(), _trees(schema_atom())),
    order=st.sampled_from(
        [
            (),
            (Order(Field("metrics", "acc"), True),),
            (Order(Field("metrics", "loss"), False),),
            (Order(Field("params", "lr"), False),),
            (Order(Field("params", "lr"), True),),
            (Order(Field("params", "opt"), True),),
            (Order(Field("attr", "created"), True),),
        ]
    ),
)
def test_the_sql_selects_and_orders_what_the_python_oracle_does(store, where, order):
    q = Query(where, order, None)
    try:
        parse(to_text(q))
    except Exception:  # a generated combination the type checker refuses (mixed kinds)
        return
    everyone = EVERYONE.setdefault("runs", store.get_runs(_all_ids(store)))
    expected = [r for r in everyone if matches(where, r, NOW)]
    page = search_runs(store, "p", q, limit=10_000, now=NOW)
    assert {r.id for r in page.runs} == {r.id for r in expected}, to_text(q)
    if order:
        o = order[0]
        # Ties are broken by run id in the direction of the last key.
        expected.sort(key=lambda r: r.id, reverse=o.descending)
        expected.sort(key=lambda r: _sort_key(r, order))
        assert [r.id for r in page.runs] == [r.id for r in expected], to_text(q)
    else:
        assert [r.created_at for r in page.runs] == sorted(
            (r.created_at for r in expected), reverse=True
        )


def _all_ids(store: MetadataStore) -> list[str]:
    from sqlalchemy import select

    from reference_impls.tracking.schema import Run

    with store.engine.connect() as conn:
        return list(conn.scalars(select(Run.id)))
