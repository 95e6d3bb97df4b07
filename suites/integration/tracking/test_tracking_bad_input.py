"""Bad input at the store's boundary, on real SQLite and PostgreSQL: text neither database can
store (lone surrogates, NUL), page tokens edited to absurd offsets, and ordering by text
params. Each refusal is a TrackingError naming the value and leaves nothing behind."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reference_impls.tracking.backend import EmbeddedBackend
from reference_impls.tracking.errors import FilterError, TrackingError
from reference_impls.tracking.query import _digest, parse


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedBackend]:
    db = request.getfixturevalue("pg_url") if request.param == "postgresql" else tmp_path / "t.db"
    b = EmbeddedBackend(db, tmp_path / "artifacts")
    try:
        yield b
    finally:
        b.close()


BAD_TEXT = {"a\udcffb": "surrogate", "a\x00b": "NUL"}


def test_text_no_database_stores_is_refused_by_name(store):
    # One test per backend (a PostgreSQL database per test is most of the time).
    for text, why in BAD_TEXT.items():
        for kwargs in (
            {"params": {"note": text}},
            {"tags": {"team": text}},
            {"name": text},
            {"git_commit": text},
        ):
            with pytest.raises(TrackingError) as err:
                store.create_run("p", **kwargs)
            message = str(err.value)
            assert why in message or "invalid lineage node" in message, message
            assert ascii(text)[1:-1] in message, message  # the value, printably
    assert store.meta.projects() == []  # no half-created project or run
    rid = store.create_run("p")
    for text, why in BAD_TEXT.items():
        with pytest.raises(TrackingError, match=why):
            store.set_tags(rid, {"team": text})
        with pytest.raises(FilterError, match=why):
            store.search("p", f"tags.team = '{text}'")
        with pytest.raises(TrackingError, match="invalid lineage relation"):
            store.add_edges([(f"run:{rid}", f"artifact:{'0' * 64}", text)])
    assert store.get_run(rid).tags == {}


def test_environment_with_surrogates_round_trips_and_empty_tags_write_nothing(store):
    # JSON escapes what text columns refuse: an environment is stored, not refused.
    rid = store.create_run("p", environment={"path": "/tmp/\udcff", "nul": "a\x00b"})
    assert store.get_run(rid).environment == {"path": "/tmp/\udcff", "nul": "a\x00b"}
    # No tags is nothing to write (an empty executemany inserted a row of NULLs: a 500).
    store.set_tags(rid, {})
    assert store.get_run(rid).tags == {}


def _token(offset: Any, query: str = "") -> str:
    raw = json.dumps({"o": offset, "q": _digest(parse(query))}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_an_edited_page_token_offset_is_a_filter_error(store):
    store.create_run("p")
    for offset in (10**30, 2**63, -1):
        with pytest.raises(FilterError, match=f"offset {offset} is out of range"):
            store.search("p", "", page_token=_token(offset))
    # A real token of the same query still works.
    assert store.search("p", "", page_token=_token(0)).runs


def test_order_by_a_text_param_orders_by_its_text_on_both_backends(store):
    ids = {}
    for opt in ("sgd", "adam", "rmsprop"):
        ids[opt] = store.create_run("p", params={"opt": opt})
    store.create_run("p", params={"lr": 0.1})  # no opt: last either way
    asc = [r.params.get("opt") for r in store.search("p", order_by="params.opt").runs]
    desc = [r.params.get("opt") for r in store.search("p", order_by="params.opt desc").runs]
    assert asc == ["adam", "rmsprop", "sgd", None]
    assert desc == ["sgd", "rmsprop", "adam", None]
    # A param that is a number in some runs and text in others: numbers first.
    for v in ("b", 2, "a", 1.5, True):
        store.create_run("q", params={"x": v})
    got = [r.params["x"] for r in store.search("q", order_by="params.x").runs]
    assert got == [True, 1.5, 2, "a", "b"]


def test_cli_store_paths_are_refused_with_exit_2_and_create_nothing(tmp_path, capsys):
    from reference_impls.tracking.__main__ import main

    (tmp_path / "file").write_text("a regular file")
    (tmp_path / "dir").mkdir()
    (tmp_path / "junk.db").write_bytes(b"not a database, just bytes" * 10)
    good = ["--artifacts", str(tmp_path / "store")]
    cases = {
        "under a regular file": (["--db", str(tmp_path / "file" / "t.db"), *good], "file"),
        "a directory": (["--db", str(tmp_path / "dir"), *good], "dir"),
        "not a database": (["--db", str(tmp_path / "junk.db"), *good], "junk.db"),
        "artifacts under a file": (
            ["--db", str(tmp_path / "t.db"), "--artifacts", str(tmp_path / "file" / "a")],
            "file",
        ),
        "artifacts a file": (
            ["--db", str(tmp_path / "t.db"), "--artifacts", str(tmp_path / "file")],
            "file",
        ),
    }
    before = sorted(p.name for p in tmp_path.iterdir())
    for label, (args, named) in cases.items():
        for command in (["search", *args, "p"], ["migrate", *args], ["gc", "--dry-run", *args]):
            assert main(command) == 2, (label, command)
            err = capsys.readouterr().err
            assert "error:" in err and named in err and "Traceback" not in err, (label, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing created


def test_gc_refuses_a_grace_that_would_collect_uploads_in_flight(tmp_path, capsys):
    from reference_impls.tracking.__main__ import main
    from reference_impls.tracking.retention import collect

    backend = EmbeddedBackend(tmp_path / "t.db", tmp_path / "artifacts")
    # Bytes stored a moment ago that no row names yet: an upload between its steps (2) and (3).
    (tmp_path / "f.bin").write_bytes(b"in flight")
    sha, _, _ = backend.store.put_file(tmp_path / "f.bin")
    args = ["--db", str(tmp_path / "t.db"), "--artifacts", str(tmp_path / "artifacts")]
    for flag in ("--upload-grace-s", "--soft-delete-grace-days"):
        for value in ("-1", "nan", "-inf"):
            with pytest.raises(SystemExit) as exited:  # a negative grace deleted the bytes
                main(["gc", *args, f"{flag}={value}"])
            assert exited.value.code == 2
            assert f"{flag}: expected a finite number >= 0, got '{value}'" in (
                capsys.readouterr().err
            )
            assert backend.store.exists(sha)
            with pytest.raises(ValueError, match="grace_s must be a finite number >= 0"):
                collect(backend.meta, backend.store, upload_grace_s=float(value))
    assert backend.store.exists(sha)
    backend.close()


def test_import_report_refuses_a_hostile_report_whole(tmp_path, capsys):
    from reference_impls.tracking.__main__ import main
    from reference_impls.tracking.metadata import MetadataStore

    rep = tmp_path / "rep"
    rep.mkdir()
    args = ["--db", str(tmp_path / "t.db"), "--artifacts", str(tmp_path / "a"), str(rep)]
    for report, message in (
        ({"tests": [1]}, "tests[0] is int, not an object"),  # was an AttributeError
        ({"tests": {}}, "no 'tests' list"),
        ({"tests": [], "duration_s": 1e999}, "metric duration_s at step 0 is inf"),
    ):
        (rep / "report.json").write_text(json.dumps(report))
        assert main(["import-report", *args]) == 1
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert MetadataStore(str(tmp_path / "t.db")).count_runs() == 0  # no run half imported
    # Tiers that are not names become metric names that are.
    (rep / "report.json").write_text(json.dumps({"tests": [{"tier": 5, "outcome": "passed"}]}))
    assert main(["import-report", *args]) == 0
    run_id = capsys.readouterr().out.strip()
    metrics = MetadataStore(str(tmp_path / "t.db")).get_run(run_id).metrics
    assert metrics["_5.passed"] == 1 and metrics["tests_passed"] == 1
