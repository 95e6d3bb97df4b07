"""The search language: what parses to what, what is refused and why, and canonical printing."""

from __future__ import annotations

import pytest

from reference_impls.tracking.errors import FilterError
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
    parse,
    to_text,
)

M = Field("metrics", "val_acc")
LR = Field("params", "lr")


def test_the_documented_example_parses_to_typed_atoms():
    q = parse(
        "metrics.val_acc > 0.85 and params.lr between 1e-4 and 1e-3 and tags.team = 'nlp' "
        "and created > -30d order by metrics.val_acc desc limit 20"
    )
    assert q == Query(
        And(
            (
                Compare(M, ">", 0.85),
                Between(LR, 1e-4, 1e-3),
                Compare(Field("tags", "team"), "=", "nlp"),
                Compare(Field("attr", "created"), ">", RelTime(30, "d")),
            )
        ),
        (Order(M, True),),
        20,
    )


def test_and_binds_tighter_than_or_and_not_applies_to_one_atom():
    q = parse("not metrics.a > 1 or metrics.b < 2 and params.c = 'x'")
    assert q.where == Or(
        (
            Not(Compare(Field("metrics", "a"), ">", 1)),
            And((Compare(Field("metrics", "b"), "<", 2), Compare(Field("params", "c"), "=", "x"))),
        )
    )


def test_quotes_are_doubled_inside_text_and_keywords_in_text_are_text():
    q = parse("tags.note = 'it''s and or not; DROP TABLE runs; --'")
    assert q.where == Compare(Field("tags", "note"), "=", "it's and or not; DROP TABLE runs; --")
    assert parse(to_text(q)) == q


def test_in_lists_and_booleans_and_iso_dates():
    q = parse("status in ('finished', 'failed') and params.bn = true and created >= '2026-11-30'")
    assert q.where == And(
        (
            In(Field("attr", "status"), ("finished", "failed")),
            Compare(Field("params", "bn"), "=", True),
            Compare(Field("attr", "created"), ">=", "2026-11-30"),
        )
    )


def test_printing_is_canonical_and_parses_back_to_the_same_tree():
    text = "(metrics.a > 1 or metrics.b <= -2.5e-07) and not (tags.t != 'x' and params.p in (1, 2))"
    q = parse(text)
    assert to_text(q) == text
    assert parse(to_text(q)) == q


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("foo.bar > 1", "unknown field 'foo.bar'"),
        ("metrics > 1", "unknown field 'metrics'"),
        ("metrics.acc > 'high'", "metrics are numbers"),
        ("tags.team = nlp", "expected a value"),
        ("tags.team = 3", "tags are text"),
        ("params.lr > true", "true/false compare only with = and !="),
        ("metrics.acc >", "expected a value"),
        ("metrics.acc > 1 and", "expected a field"),
        ("(metrics.acc > 1", "expected ')'"),
        ("metrics.acc > 1)", "expected AND, OR, ORDER BY, LIMIT or the end"),
        ("metrics.acc between 1", "expected AND"),
        ("metrics.acc ~ 1", "unexpected character '~'"),
        ("tags.t = 'unterminated", "unterminated text"),
        ("metrics.acc > 1e999", "out of range"),
        ("status = 'exploded'", "unknown status 'exploded'"),
        ("created > 'yesterday'", "not an ISO date"),
        ("limit 0", "limit must be between 1 and 10000"),
        ("limit 99999999", "limit must be between 1 and 10000"),
        ("order metrics.a", "expected BY"),
        ("metrics.a > 1; DROP TABLE runs", "unexpected character ';'"),
        ("metrics.a > 1 -- comment", "unexpected character '-'"),
        ("params.lr > -30d", "a relative time compares only with created or ended"),
    ],
)
def test_bad_filters_are_refused_with_a_message_naming_the_problem(text, fragment):
    with pytest.raises(FilterError, match=None) as info:
        parse(text)
    assert fragment in str(info.value), str(info.value)


def test_errors_carry_the_position_of_the_problem():
    with pytest.raises(FilterError) as info:
        parse("metrics.a > 1 and foo.b = 2")
    assert info.value.position == len("metrics.a > 1 and ")


def test_limits_on_size_nesting_and_atom_count():
    with pytest.raises(FilterError, match="characters long"):
        parse("metrics.a > 1 and " * 1000 + "metrics.a > 1")
    with pytest.raises(FilterError, match="nests deeper"):
        parse("(" * 60 + "metrics.a > 1" + ")" * 60)
    with pytest.raises(FilterError, match="more than 200 comparisons"):
        parse(" or ".join(f"metrics.a{i} > 1" for i in range(201)))
    with pytest.raises(FilterError, match="NUL"):
        parse("tags.a = 'x\x00'")


def test_integers_beyond_2_53_become_floats_and_floats_keep_their_type():
    q = parse("metrics.a = 9007199254740993 or metrics.b = 3.0 or metrics.c = 3")
    assert q.where == Or(
        (
            Compare(Field("metrics", "a"), "=", 9007199254740992.0),
            Compare(Field("metrics", "b"), "=", 3.0),
            Compare(Field("metrics", "c"), "=", 3),
        )
    )
    assert isinstance(q.where.items[1].value, float)
    assert isinstance(q.where.items[2].value, int)
