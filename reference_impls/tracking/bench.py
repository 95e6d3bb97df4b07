"""Side-by-side speed of the tracker and MLflow on the same workloads, in one run.

    python -m reference_impls.tracking.bench --mlflow-python /tmp/mlflowenv/bin/python
    python -m reference_impls.tracking.bench --quick --no-postgres --no-s3   # a smoke run
    python -m reference_impls.tracking.bench --artifacts-only --artifact-mb 128 --artifact-repeats 9

MLflow is never a dependency of this project: it is measured in its own interpreter
(``--mlflow-python``, a throwaway venv with ``pip install mlflow``) by the script in
bench_mlflow.py, on the same workloads, in the same run, one after the other:

* **metric logging**: 100,000 points (10 keys x 10,000 steps) into one run; ours through
  ``run.log_metrics`` (buffered, flushed in batches by the background writer, timed until
  everything is stored); MLflow through ``log_batch`` of 1,000 metrics per call (its
  fastest path; its per-call limit). Points per second.
* **run creation**: a run with 20 params and 5 metrics, ended. Runs per second.
* **search**: 100,000 runs in one project/experiment (bulk-inserted, identical data for
  both; each run has 5 params, 2 metrics and a tag); ``metrics.val_acc > 0.85`` ordered by
  ``val_acc`` descending, first 100. p50 / p90 over repeats, in ms.
* **artifacts**: a ``--artifact-mb`` MB file logged to three runs: MB/s against a plain
  ``shutil.copyfile`` of the same file (local) and a plain boto3 ``upload_file`` (S3,
  SeaweedFS on loopback), and bytes stored afterwards.

Ours runs on SQLite (the default) and, with binaries present, PostgreSQL (a throwaway
cluster with fsync on). Prints a markdown table (docs/benchmarks/tracking.md holds the
recorded one) and optionally writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from reference_impls.tracking.bench_mlflow import measure_mlflow

SEED = 20261201
TARGET_P50_MS = 50.0
SEARCH_QUERY = "metrics.val_acc > 0.85 order by metrics.val_acc desc limit 100"


# ----------------------------------------------------------------------------- data sets
# The four tables bulk_runs fills, their columns in the order of each row tuple below.
_BULK_COLUMNS = {
    "runs": (
        "id",
        "project_id",
        "name",
        "status",
        "created_at",
        "ended_at",
        "git_commit",
        "environment",
        "deleted_at",
    ),
    "params": ("run_id", "key", "kind", "num_value", "str_value"),
    "latest_metrics": ("run_id", "key", "step", "value"),
    "tags": ("run_id", "key", "value"),
}
# Page cache for the SQLite build: the primary keys are random uuids, so every insert lands
# on a random page of each index; with SQLite's default 2 MiB cache those pages were read
# and written back again and again (100,000 runs: 54 s of executemany, against 3.2 s for
# 10,000). 256 MiB holds the whole database (176 MB at 100,000 runs).
_BULK_CACHE_KIB = 256 * 1024


def _bulk_chunks(
    pid: int, n: int, seed: int, chunk: int, now: float
) -> Iterator[dict[str, list[tuple[Any, ...]]]]:
    """The rows of ``n`` runs, ``chunk`` runs at a time, as tuples in ``_BULK_COLUMNS``
    order. The random draws (and so the rows) depend on ``seed``, ``chunk`` and ``now``."""
    rng = np.random.default_rng(seed)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        ids = [uuid.UUID(int=int(x)).hex for x in rng.integers(0, 2**62, m)]
        created = now - rng.uniform(0, 90 * 86_400, m)
        acc = rng.random(m)
        loss = rng.random(m)
        lr = 10 ** rng.uniform(-5, -1, m)
        params: list[tuple[Any, ...]] = []
        for j, i in enumerate(ids):
            params += [
                (i, "lr", "num", float(lr[j]), None),
                (i, "layers", "num", float(j % 8), None),
                (i, "batch", "num", 32.0, None),
                (i, "opt", "str", None, "adam"),
                (i, "data", "str", None, "mnist"),
            ]
        yield {
            "runs": [
                (i, pid, i[:8], "finished", float(c), float(c) + 60, None, None, None)
                for i, c in zip(ids, created, strict=True)
            ],
            "params": params,
            "latest_metrics": [
                (i, k, 100, float(v[j]))
                for j, i in enumerate(ids)
                for k, v in (("val_acc", acc), ("loss", loss))
            ],
            "tags": [(i, "team", "nlp" if j % 2 else "cv") for j, i in enumerate(ids)],
        }


def bulk_runs(
    meta: Any,
    project: str,
    n: int,
    *,
    seed: int = SEED,
    chunk: int = 20_000,
    now: float | None = None,
    core: bool = False,
) -> None:
    """Insert ``n`` runs straight into the tables (a data set for search benchmarks: creating
    100,000 runs through the API would time the API, not the search).

    On SQLite the rows go in through the driver's ``executemany``, in one transaction, with a
    page cache that holds the database and ``synchronous=OFF`` for the build (the pragmas are
    put back afterwards): 100,000 runs in less than half the time of SQLAlchemy Core inserts
    with the default cache (docs/perf.md). Elsewhere (PostgreSQL), or with ``core=True``,
    through SQLAlchemy Core inserts, a transaction per chunk. Either way the same rows, in
    the same order (so the same rowids): suites/unit/tracking/test_bulk_runs.py compares
    them. ``now`` (default: the current time) is what ``created`` is counted back from."""
    pid = meta.project_id(project)
    now = time.time() if now is None else now
    chunks = _bulk_chunks(pid, n, seed, chunk, now)
    if meta.engine.dialect.name == "sqlite" and not core:
        _bulk_sqlite(meta.engine, chunks)
        return
    from sqlalchemy import insert

    from reference_impls.tracking.schema import LatestMetric, Param, Run, Tag

    tables = {"runs": Run, "params": Param, "latest_metrics": LatestMetric, "tags": Tag}
    for rows in chunks:
        with meta.engine.begin() as conn:
            for name, table in tables.items():
                cols = _BULK_COLUMNS[name]
                conn.execute(insert(table), [dict(zip(cols, r, strict=True)) for r in rows[name]])


def _bulk_sqlite(engine: Any, chunks: Iterator[dict[str, list[tuple[Any, ...]]]]) -> None:
    raw = engine.raw_connection()  # isolation_level None (tracking/db.py): explicit BEGIN
    cur = raw.cursor()
    try:
        cache = cur.execute("PRAGMA cache_size").fetchone()[0]
        sync = cur.execute("PRAGMA synchronous").fetchone()[0]
        cur.execute(f"PRAGMA cache_size=-{_BULK_CACHE_KIB}")
        cur.execute("PRAGMA synchronous=OFF")  # a benchmark's throwaway file: no fsyncs
        try:
            cur.execute("BEGIN IMMEDIATE")
            try:
                for rows in chunks:
                    for name, cols in _BULK_COLUMNS.items():
                        marks = ", ".join("?" * len(cols))
                        cur.executemany(
                            f"INSERT INTO {name} ({', '.join(cols)}) VALUES ({marks})", rows[name]
                        )
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
        finally:
            cur.execute(f"PRAGMA synchronous={int(sync)}")
            cur.execute(f"PRAGMA cache_size={int(cache)}")
    finally:
        cur.close()
        raw.close()


# ----------------------------------------------------------------------------- workloads
def log_points(tracker: Any, points: int = 100_000, keys: int = 10) -> tuple[float, float]:
    """(points per second, points per CPU second of this process) into one run, until every
    point is stored."""
    steps = points // keys
    names = [f"m{k}" for k in range(keys)]
    with tracker.start_run("bench-log") as run:
        t0, c0 = time.perf_counter(), time.process_time()
        for step in range(steps):
            run.log_metrics(dict.fromkeys(names, step * 0.001), step=step)
        run.flush()
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return steps * keys / elapsed, steps * keys / cpu


def create_runs(tracker: Any, n: int = 200) -> tuple[float, float]:
    """(runs per second, runs per CPU second): 20 params and 5 metrics each, ended."""
    params = {f"p{i}": (i * 0.5 if i % 2 else f"v{i}") for i in range(20)}
    metrics = {f"m{i}": float(i) for i in range(5)}
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        with tracker.start_run("bench-create", params=params) as run:
            run.log_metrics(metrics, step=0)
    return n / (time.perf_counter() - t0), n / (time.process_time() - c0)


def search_latency(
    tracker: Any, project: str, repeats: int = 30
) -> tuple[float, float, float, int]:
    """(p50 ms, p90 ms, p50 CPU ms of this process, runs returned) of SEARCH_QUERY."""
    times, cpu = [], []
    found = 0
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        page = tracker.search(project, SEARCH_QUERY)
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
        found = len(page.runs)
    times.sort()
    p90 = times[int(0.9 * (len(times) - 1))]
    return statistics.median(times), p90, statistics.median(cpu), found


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cpu_timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all threads)."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def artifacts_local(workdir: Path, size_mb: int, repeats: int) -> dict[str, Any]:
    """``run.log_artifact`` (hash + store + fsync + the reference committed) of a file in the
    page cache, against ``shutil.copyfile`` + fsync of the same file; in pairs, each pair in
    the other order from the last (neither side always follows the other's writes), so both
    see the same conditions. Ratio: median over pairs of copy time / our time."""
    from reference_impls.tracking.client import Tracker

    src = workdir / "artifact.bin"
    _random_file(src, size_mb)
    ours: list[float] = []
    copy: list[float] = []
    ours_cpu: list[float] = []
    copy_cpu: list[float] = []
    stored = 0
    load = [os.getloadavg()[0]]
    for r in range(repeats):
        tracker = Tracker(workdir / f"a{r}.db", workdir / f"art{r}")
        runs = [tracker.start_run("bench-art") for _ in range(3)]
        first = runs[0]
        dest = workdir / f"copy{r}.bin"

        def plain(dest: Path = dest) -> None:
            shutil.copyfile(src, dest)
            with open(dest, "rb+") as f:  # the store syncs its objects; so does the baseline
                os.fsync(f.fileno())

        def ours_put(first: Any = first) -> None:
            first.log_artifact(src, "w.bin")

        for which in ("ours", "copy") if r % 2 == 0 else ("copy", "ours"):
            wall, cpu = _cpu_timed(ours_put if which == "ours" else plain)
            (ours if which == "ours" else copy).append(wall)
            (ours_cpu if which == "ours" else copy_cpu).append(cpu)
        for run in runs[1:]:
            run.log_artifact(src, "w.bin")  # the same bytes again: stored once
        for run in runs:
            run.finish()
        stored = sum(
            f.stat().st_size for f in (workdir / f"art{r}" / "objects").rglob("*") if f.is_file()
        )
        tracker.close()
        shutil.rmtree(workdir / f"art{r}")
        dest.unlink()
    load.append(os.getloadavg()[0])
    mb = size_mb * 1.048576
    return {
        "ours_MBps": mb / statistics.median(ours),
        "copy_MBps": mb / statistics.median(copy),
        "ratio": statistics.median(c / o for o, c in zip(ours, copy, strict=True)),
        "ours_cpu_ms": statistics.median(ours_cpu) * 1000,
        "copy_cpu_ms": statistics.median(copy_cpu) * 1000,
        "repeats": repeats,
        "stored_bytes_for_3_runs": stored,
        "file_bytes": src.stat().st_size,
        "load_1min_start_end": [round(x, 2) for x in load],
    }


def artifacts_s3(workdir: Path, size_mb: int, repeats: int) -> dict[str, Any]:
    """``backend.log_artifact`` to S3 (hash pass + HEAD + upload + the reference committed)
    against boto3's ``upload_file`` of the same file with the store's TransferConfig, both
    into the same bucket (one per pair, written to once before either is timed), in pairs
    that alternate their order. Ratio: median over pairs of boto3's time / ours. CPU: this
    process's (the client's) and, apart, the SeaweedFS process's during each side; and the
    time of one server-side copy of the uploaded object (what uploading to a staging key and
    copying to the content key would add), outside both sides' times."""
    from reference_impls.data.seaweedfs import SeaweedServer
    from reference_impls.tracking.artifacts import S3ArtifactStore
    from reference_impls.tracking.backend import EmbeddedBackend

    src = workdir / "artifact.bin"
    if not src.exists():
        _random_file(src, size_mb)
    load = [os.getloadavg()[0]]
    with SeaweedServer.start(workdir / "seaweed") as server:
        client = server.client(read_timeout=300)
        ours: list[float] = []
        plain: list[float] = []
        ours_cpu: list[float] = []
        plain_cpu: list[float] = []
        copies: list[float] = []
        server_cpu: dict[str, list[float]] = {"ours": [], "plain": [], "copy": []}
        for r in range(repeats):
            bucket = f"bench-{r}"
            client.create_bucket(Bucket=bucket)
            client.put_object(Bucket=bucket, Key="warm", Body=b"x")
            backend = EmbeddedBackend(workdir / f"s{r}.db", S3ArtifactStore(bucket, client=client))
            rid = backend.create_run("bench-s3")
            store: Any = backend.store

            def ours_put(backend: Any = backend, rid: str = rid) -> None:
                backend.log_artifact(rid, src, "w.bin")

            # The same configuration of boto3's managed transfer, without hashing or a reference.
            def upload(bucket: str = bucket, store: Any = store) -> None:
                client.upload_file(str(src), bucket, "plain.bin", Config=store.transfer)

            for which in ("ours", "plain") if r % 2 == 0 else ("plain", "ours"):
                s0 = _server_cpu(server)
                wall, cpu = _cpu_timed(ours_put if which == "ours" else upload)
                (ours if which == "ours" else plain).append(wall)
                (ours_cpu if which == "ours" else plain_cpu).append(cpu)
                server_cpu[which].append(_server_cpu(server) - s0)

            # What a staging upload would add: a server-side copy to the content key (not
            # part of either side's time; SeaweedFS copies the data).
            def server_copy(bucket: str = bucket) -> None:
                client.copy_object(
                    Bucket=bucket, Key="copy.bin", CopySource={"Bucket": bucket, "Key": "plain.bin"}
                )

            s0 = _server_cpu(server)
            copies.append(_timed(server_copy))
            server_cpu["copy"].append(_server_cpu(server) - s0)
            backend.close()
    load.append(os.getloadavg()[0])
    mb = size_mb * 1.048576
    return {
        "ours_MBps": mb / statistics.median(ours),
        "boto3_MBps": mb / statistics.median(plain),
        "ratio": statistics.median(p / o for o, p in zip(ours, plain, strict=True)),
        "ours_client_cpu_ms": statistics.median(ours_cpu) * 1000,
        "boto3_client_cpu_ms": statistics.median(plain_cpu) * 1000,
        "ours_server_cpu_ms": statistics.median(server_cpu["ours"]) * 1000,
        "boto3_server_cpu_ms": statistics.median(server_cpu["plain"]) * 1000,
        "server_side_copy_ms": statistics.median(copies) * 1000,
        "server_side_copy_server_cpu_ms": statistics.median(server_cpu["copy"]) * 1000,
        "repeats": repeats,
        "load_1min_start_end": [round(x, 2) for x in load],
    }


def _server_cpu(server: Any) -> float:
    """CPU seconds the SeaweedFS process has used so far (user + system, from /proc), or 0.0
    where there is no /proc."""
    try:
        fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, AttributeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def artifact_table(r: dict[str, Any]) -> str:
    """The artifact rows alone (``--artifacts-only``), as docs/benchmarks/tracking.md has them."""
    rows = [
        "| artifacts | ours | baseline | ratio (median of pairs) | CPU ms, ours / baseline |",
        "|---|---|---|---|---|",
    ]
    a = r["artifacts_local"]
    rows.append(
        f"| local, {a['file_bytes'] >> 20} MiB | {a['ours_MBps']:,.0f} MB/s | "
        f"copy+fsync {a['copy_MBps']:,.0f} MB/s | **{a['ratio']:.2f}x** ({a['repeats']} pairs) "
        f"| {a['ours_cpu_ms']:,.0f} / {a['copy_cpu_ms']:,.0f} |"
    )
    if "artifacts_s3" in r:
        b = r["artifacts_s3"]
        rows.append(
            f"| S3 (SeaweedFS) | {b['ours_MBps']:,.0f} MB/s | boto3 upload_file "
            f"{b['boto3_MBps']:,.0f} MB/s | **{b['ratio']:.2f}x** ({b['repeats']} pairs) | "
            f"{b['ours_client_cpu_ms']:,.0f} / {b['boto3_client_cpu_ms']:,.0f} client, "
            f"{b['ours_server_cpu_ms']:,.0f} / {b['boto3_server_cpu_ms']:,.0f} SeaweedFS |"
        )
        rows.append(
            f"| S3 server-side copy of that object (what a staging key would add) | "
            f"{b['server_side_copy_ms']:,.0f} ms, {b['server_side_copy_server_cpu_ms']:,.0f} ms "
            "SeaweedFS CPU | | | |"
        )
    loads = ", ".join(f"{k} {v}" for k, v in r.get("load_average", {}).items())
    rows.append(f"\n{r['machine']}; {r['date']}; 1-minute load average: {loads}")
    return "\n".join(rows)


def _random_file(path: Path, size_mb: int) -> None:
    rng = np.random.default_rng(SEED)
    with open(path, "wb") as f:
        for _ in range(size_mb):
            f.write(rng.bytes(1 << 20))


def measure_ours(
    db: str, workdir: Path, *, points: int, runs: int, search_n: int, repeats: int
) -> dict[str, Any]:
    from reference_impls.tracking.client import Tracker
    from reference_impls.tracking.metadata import MetadataStore

    tracker = Tracker(db, workdir / "artifacts")
    out: dict[str, Any] = {}
    logs = [log_points(tracker, points) for _ in range(repeats)]
    out["log_points_per_s"] = statistics.median(w for w, _ in logs)
    out["log_points_per_cpu_s"] = statistics.median(c for _, c in logs)
    made = [create_runs(tracker, runs) for _ in range(repeats)]
    out["runs_per_s"] = statistics.median(w for w, _ in made)
    out["runs_per_cpu_s"] = statistics.median(c for _, c in made)
    t0 = time.perf_counter()
    bulk_runs(tracker.backend.meta, "bench-search", search_n)
    out["search_build_s"] = time.perf_counter() - t0
    if (
        isinstance(tracker.backend.meta, MetadataStore)
        and tracker.backend.meta.dialect == "postgresql"
    ):
        with tracker.backend.meta.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    p50, p90, cpu, found = search_latency(tracker, "bench-search")
    out.update(search_p50_ms=p50, search_p90_ms=p90, search_cpu_p50_ms=cpu, search_found=found)
    tracker.close()
    return out


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m reference_impls.tracking.bench", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--mlflow-python", help="python of a venv with mlflow installed (omit: ours only)"
    )
    p.add_argument("--points", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--search-runs", type=int, default=100_000)
    p.add_argument("--artifact-mb", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--artifact-repeats",
        type=int,
        default=7,
        help="artifact puts and baseline copies, alternating (each a fraction of a second)",
    )
    p.add_argument(
        "--mlflow-search-repeats",
        type=int,
        default=5,
        help="MLflow searches at --search-runs runs (each takes seconds at 100,000 runs)",
    )
    p.add_argument(
        "--artifacts-only",
        action="store_true",
        help="only the artifact puts against their baselines (local copy+fsync, boto3 upload)",
    )
    p.add_argument("--no-postgres", action="store_true")
    p.add_argument("--no-s3", action="store_true")
    p.add_argument(
        "--quick", action="store_true", help="small sizes: a smoke run, not a measurement"
    )
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    if args.quick:
        args.points, args.runs, args.search_runs, args.artifact_mb, args.repeats = (
            10_000,
            20,
            5_000,
            16,
            1,
        )
        args.artifact_repeats = 1
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cores, "
        f"Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "config": vars(args),
        "load_average": {},  # 1-minute load average when each part started (and at the end)
    }

    def part(name: str) -> None:
        print(f"{name} ...", file=sys.stderr, flush=True)
        results["load_average"][name] = round(os.getloadavg()[0], 2)

    with tempfile.TemporaryDirectory(prefix="tracking-bench-") as tmp:
        work = Path(tmp)
        if args.artifacts_only:
            part("artifacts, local")
            results["artifacts_local"] = artifacts_local(
                work, args.artifact_mb, args.artifact_repeats
            )
            if not args.no_s3:
                part("artifacts, S3")
                results["artifacts_s3"] = artifacts_s3(
                    work, min(args.artifact_mb, 128), args.artifact_repeats
                )
            results["load_average"]["end"] = round(os.getloadavg()[0], 2)
            print(artifact_table(results))
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
            return 0
        part("ours, SQLite")
        results["sqlite"] = measure_ours(
            str(work / "ours.db"),
            work / "sqlite",
            points=args.points,
            runs=args.runs,
            search_n=args.search_runs,
            repeats=args.repeats,
        )
        part("artifacts, local")
        results["artifacts_local"] = artifacts_local(work, args.artifact_mb, args.artifact_repeats)
        if not args.no_postgres:
            from reference_impls.tracking.postgres import PostgresCluster, find_pg_bin

            if find_pg_bin() is not None:
                part("ours, PostgreSQL")
                pgdir = tempfile.mkdtemp(prefix="tracking-bench-pg-")
                try:
                    with PostgresCluster.start(pgdir, durable=True) as pg:
                        results["postgresql"] = measure_ours(
                            pg.url,
                            work / "pg",
                            points=args.points,
                            runs=args.runs,
                            search_n=args.search_runs,
                            repeats=args.repeats,
                        )
                finally:
                    shutil.rmtree(pgdir, ignore_errors=True)
        if not args.no_s3:
            part("artifacts, S3")
            results["artifacts_s3"] = artifacts_s3(
                work, min(args.artifact_mb, 128), args.artifact_repeats
            )
        if args.json:  # ours, before MLflow's (long) turn
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        if args.mlflow_python:
            part("MLflow")
            results["mlflow"] = measure_mlflow(
                args.mlflow_python,
                work / "mlflow",
                {
                    "points": args.points,
                    "runs": args.runs,
                    "search_n": args.search_runs,
                    "repeats": args.repeats,
                    "search_repeats": args.mlflow_search_repeats,
                    "seed": SEED,
                    "artifact": str(work / "artifact.bin"),
                },
            )
    results["load_average"]["end"] = round(os.getloadavg()[0], 2)
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def render(r: dict[str, Any]) -> str:
    """The markdown table: wall-clock and CPU-time figures, ratios against MLflow."""
    s, pg, ml = r["sqlite"], r.get("postgresql") or {}, r.get("mlflow") or {}

    def num(d: dict[str, Any], key: str, fmt: str = "{:,.0f}") -> str:
        return fmt.format(d[key]) if key in d else "n/a"

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.1f}x" if a and b else "n/a"

    n = r["config"]["search_runs"]
    rows = [
        "| workload | ours, SQLite | ours, PostgreSQL | MLflow, SQLite | ours (SQLite) / MLflow |",
        "|---|---|---|---|---|",
    ]
    for label, key, fmt, better in (
        ("metric logging, points/s", "log_points_per_s", "{:,.0f}", "higher"),
        ("metric logging, points/CPU-s", "log_points_per_cpu_s", "{:,.0f}", "higher"),
        ("run creation (20 params, 5 metrics), runs/s", "runs_per_s", "{:,.1f}", "higher"),
        ("run creation, runs/CPU-s", "runs_per_cpu_s", "{:,.1f}", "higher"),
        (f"search at {n:,} runs, p50 ms", "search_p50_ms", "{:.1f}", "lower"),
        (f"search at {n:,} runs, p90 ms", "search_p90_ms", "{:.1f}", "lower"),
        (f"search at {n:,} runs, p50 CPU ms", "search_cpu_p50_ms", "{:.1f}", "lower"),
    ):
        a, b = s.get(key), ml.get(key)
        rel = ratio(a, b) if better == "higher" else ratio(b, a)
        rows.append(
            f"| {label} | {num(s, key, fmt)} | {num(pg, key, fmt)} | {num(ml, key, fmt)} | {rel} |"
        )
    a = r["artifacts_local"]
    rows.append(
        f"| artifact, local, MB/s | {a['ours_MBps']:,.0f} ({a['ratio']:.2f}x of copy+fsync at "
        f"{a['copy_MBps']:,.0f}; CPU {a['ours_cpu_ms']:,.0f} ms vs {a['copy_cpu_ms']:,.0f} ms) "
        f"| same store | {num(ml, 'artifact_MBps')} | "
        f"{ratio(a['ours_MBps'], ml.get('artifact_MBps'))} |"
    )
    rows.append(
        f"| bytes stored, one {a['file_bytes']:,}-byte file in 3 runs | "
        f"{a['stored_bytes_for_3_runs']:,} | same store | "
        f"{num(ml, 'artifact_stored_bytes_for_3_runs')} | |"
    )
    if "artifacts_s3" in r:
        b = r["artifacts_s3"]
        rows.append(
            f"| artifact, S3 (SeaweedFS), MB/s | {b['ours_MBps']:,.0f} ({b['ratio']:.2f}x of "
            f"boto3 upload_file at {b['boto3_MBps']:,.0f}) | same store | n/a | |"
        )
    met = "met" if s["search_p50_ms"] <= TARGET_P50_MS else "NOT met"
    cpu_met = "met" if s["search_cpu_p50_ms"] <= TARGET_P50_MS else "NOT met"
    rows += [
        "",
        f"search p50 target <= {TARGET_P50_MS:.0f} ms on SQLite: {met} wall-clock "
        f"({s['search_p50_ms']:.1f} ms), {cpu_met} in CPU time ({s['search_cpu_p50_ms']:.1f} ms); "
        f"{s['search_found']} runs returned (MLflow: {ml.get('search_found', 'n/a')})",
    ]
    if ml:
        rows.append(
            f"MLflow {ml['mlflow_version']}: one log_metric call {ml['one_log_metric_ms']:.1f} ms"
        )
    loads = ", ".join(f"{k} {v}" for k, v in r.get("load_average", {}).items())
    rows.append(f"{r['machine']}; {r['date']}; 1-minute load average: {loads}")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
