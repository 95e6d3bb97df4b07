"""The search benchmarks' data set (``bulk_runs``): its SQLite path writes exactly the rows, in
the same order, that the SQLAlchemy Core path writes, so a database built by either is the
same data set and results measured on one stay comparable with the other."""

from __future__ import annotations

import hashlib

from reference_impls.tracking.bench import _BULK_COLUMNS, bulk_runs
from reference_impls.tracking.client import Tracker

NOW = 1_800_000_000.0


def _dump(path) -> dict[str, tuple[int, str]]:
    """Row count and a sha256 of every row, rowid included, in rowid order, per table."""
    tracker = Tracker(path, path.parent / "art")
    try:
        raw = tracker.backend.meta.engine.raw_connection()
        try:
            out = {}
            for name, cols in {"projects": ("id", "name"), **_BULK_COLUMNS}.items():
                rows = raw.execute(
                    f"SELECT rowid, {', '.join(cols)} FROM {name} ORDER BY rowid"
                ).fetchall()
                if name == "params":  # num_value: 10 ** uniform(-5, -1) for "lr"
                    rows = [(*r[:4], _cpu_independent(r[4]), r[5]) for r in rows]
                out[name] = (len(rows), hashlib.sha256(repr(rows).encode()).hexdigest())
            return out
        finally:
            raw.close()
    finally:
        tracker.close()


def _cpu_independent(value: float | None) -> str | None:
    """The value to 9 significant digits. ``10 ** x`` over an array is numpy's SIMD power,
    whose last bit differs between CPUs: with AVX-512 (this project's VM since 2026-12-03)
    some learning rates differ by one ulp from those of a CPU without it (the same rows with
    NPY_DISABLE_CPU_FEATURES naming the AVX-512 features). A drift of the draws moves every
    value far beyond the 9th digit; one ulp reaches it for about 1 value in 10^6."""
    return None if value is None else f"{value:.9g}"


def _build(path, *, core: bool, n: int = 2_500, chunk: int = 1_000) -> None:
    tracker = Tracker(path, path.parent / "art")
    try:
        bulk_runs(tracker.backend.meta, "bench", n, chunk=chunk, now=NOW, core=core)
    finally:
        tracker.close()


def test_sqlite_path_writes_the_core_paths_rows(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _build(tmp_path / "a" / "t.db", core=True)
    _build(tmp_path / "b" / "t.db", core=False)
    core, fast = _dump(tmp_path / "a" / "t.db"), _dump(tmp_path / "b" / "t.db")
    assert core["runs"][0] == 2_500
    assert core["params"][0] == 5 * 2_500
    assert core["latest_metrics"][0] == 2 * 2_500
    assert core["tags"][0] == 2_500
    assert fast == core


# The rows bulk_runs wrote before its SQLite path existed (the Core-only version of
# reference_impls/tracking/bench.py, 67ddaeb), for n=2,500, chunk=1,000, ``now`` = NOW: the
# data set must not drift, or results stored for bench_tracking.Search stop being comparable.
# (The draws are numpy's default_rng stream; a numpy release that changed it would show here.
# The params hash is of values to 9 digits, _cpu_independent: the same with and without AVX-512.)
PINNED = {
    "projects": (1, "a1ce794249b5f11be30bf68a9acb45be436028dcd5fe6b3c9b493639712a4939"),
    "runs": (2_500, "dc97ebc8e590192051f57843b5c68d9084383fe1a48d8f3748aca3c68d24d31f"),
    "params": (12_500, "024e4d66b202b09c8569cb929730889fe014acc844936ae943a27a02ec918747"),
    "latest_metrics": (5_000, "016a18201e6e7a2e6625db2069b80bf6d715d2e6a664bc387e5275620426bf85"),
    "tags": (2_500, "3ff2d8613a066dc7c48d76d63b997c0b1e7d33b58d62c79bbcc80ed3c793b3fd"),
}


def test_the_rows_are_those_of_the_core_only_version(tmp_path):
    _build(tmp_path / "t.db", core=False)
    assert _dump(tmp_path / "t.db") == PINNED


def test_seed_and_chunk_decide_the_rows(tmp_path):
    # The comparison above can fail: a different draw gives different rows.
    for sub, chunk in (("a", 1_000), ("b", 500)):
        (tmp_path / sub).mkdir()
        _build(tmp_path / sub / "t.db", core=False, chunk=chunk)
    a, b = _dump(tmp_path / "a" / "t.db"), _dump(tmp_path / "b" / "t.db")
    assert a["runs"][0] == b["runs"][0]
    assert a["runs"][1] != b["runs"][1]


def test_sqlite_path_puts_the_pragmas_back(tmp_path):
    path = tmp_path / "t.db"
    tracker = Tracker(path, tmp_path / "art")
    try:
        engine = tracker.backend.meta.engine
        raw = engine.raw_connection()
        try:
            before = [
                raw.execute(f"PRAGMA {p}").fetchone()[0] for p in ("cache_size", "synchronous")
            ]
        finally:
            raw.close()
        bulk_runs(tracker.backend.meta, "bench", 100, now=NOW)
        raw = engine.raw_connection()
        try:
            after = [
                raw.execute(f"PRAGMA {p}").fetchone()[0] for p in ("cache_size", "synchronous")
            ]
            assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
        finally:
            raw.close()
    finally:
        tracker.close()
    assert after == before
