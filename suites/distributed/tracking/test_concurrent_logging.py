"""Eight processes log to one store at the same time (SQLite: one file, WAL, BEGIN
IMMEDIATE; PostgreSQL: one server): every point is present, none twice, no run is lost."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from reference_impls.tracking.backend import EmbeddedBackend
from reference_impls.tracking.postgres import PostgresCluster, find_pg_bin
from reference_impls.tracking.schema import Metric, Run

REPO = Path(__file__).resolve().parents[3]
WORKERS = 8
STEPS = 800  # per worker and key

WORKER = textwrap.dedent(
    """
    import sys
    from reference_impls.tracking.client import Tracker
    db, art, shared_run, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    steps = int(sys.argv[5])
    tracker = Tracker(db, art, flush_points=200, flush_interval_s=0.05)
    with tracker.start_run("p", name=f"worker-{rank}", params={"rank": rank}) as run:
        for step in range(steps):
            run.log_metrics({"loss": 1.0 / (step + 1), "rank": float(rank)}, step=step)
            if step % 50 == 49:
                run.flush()  # many small transactions, interleaved with the other writers'

    # The shared run: each worker owns a disjoint range of steps of one key.
    from reference_impls.tracking.client import Run
    shared = Run(tracker, shared_run, "p")
    for j in range(steps):
        shared.log_metrics({"all": float(rank)}, step=rank * steps + j)
    shared.flush()
    print(run.batches_flushed, shared.batches_flushed)
    """
)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "t.db")
        return
    if find_pg_bin() is None:
        pytest.skip(
            "PostgreSQL binaries not under /usr/lib/postgresql/*/bin (.ci/run installs them)"
        )
    workdir = tempfile.mkdtemp(prefix="tracking-pg-")  # outside pytest's private basetemp
    try:
        with PostgresCluster.start(workdir) as cluster:
            cluster.stop_mode = "immediate"
            yield cluster.url
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_eight_processes_logging_at_once_lose_nothing_and_store_nothing_twice(db_url, tmp_path):
    art = str(tmp_path / "artifacts")
    backend = EmbeddedBackend(db_url, art)  # migrates once before the workers start
    shared = backend.create_run("p", name="shared")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, db_url, art, shared, str(rank), str(STEPS)],
            cwd=REPO,
            env=os.environ.copy(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(WORKERS)
    ]
    outputs = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        outputs.append(out.decode())
        assert p.returncode == 0, out.decode()[-3000:]
    # Each worker wrote in many batches, so the writers really interleaved.
    assert all(int(o.split()[0]) >= STEPS // 50 for o in outputs), outputs
    with backend.meta.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Run)) == WORKERS + 1
        total = conn.scalar(select(func.count()).select_from(Metric))
    assert total == WORKERS * STEPS * 2 + WORKERS * STEPS
    steps = [s for s, _, _ in backend.metric_history(shared, "all")]
    assert steps == list(range(WORKERS * STEPS))  # every point, none twice, in order
    values = [v for _, v, _ in backend.metric_history(shared, "all")]
    assert values == [float(s // STEPS) for s in range(WORKERS * STEPS)]
    for run in backend.search("p", "params.rank >= 0", order_by="params.rank asc").runs:
        assert run.status == "finished"
        assert run.metrics == {"loss": 1.0 / STEPS, "rank": float(run.params["rank"])}
        assert len(backend.metric_history(run.id, "loss")) == STEPS
    backend.close()
