"""SIGKILL in the middle of an artifact upload and in the middle of a metric batch flush:
the store opens cleanly, no reference names missing bytes, a batch is all there or not at
all, and collection removes what the dead writer left. Real processes, real kills."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from reference_impls.tracking.artifacts import LocalArtifactStore
from reference_impls.tracking.backend import EmbeddedBackend
from reference_impls.tracking.retention import collect
from reference_impls.tracking.schema import Artifact, Metric, Upload

REPO = Path(__file__).resolve().parents[3]

UPLOADER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from reference_impls.tracking.backend import EmbeddedBackend
    db, store, src, marker = sys.argv[1:5]
    backend = EmbeddedBackend(db, store)
    run_id = backend.create_run("p")
    done = [0]
    def progress(n):
        done[0] += n
        if done[0] >= 4 << 20:  # some bytes are out: tell the parent, then hang mid-upload
            Path(marker + ".tmp").write_text(run_id)
            os.replace(marker + ".tmp", marker)  # whole, never seen half-written
            time.sleep(3600)
    backend.log_artifact(run_id, src, "big.bin", progress=progress)
    """
)

FLUSHER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from reference_impls.tracking.client import Tracker
    db, art, marker = sys.argv[1:4]
    tracker = Tracker(db, art, flush_points=100_000, max_buffered_points=200_000,
                      flush_interval_s=3600)
    run = tracker.start_run("p")
    run.log_metrics({"x": 0.0}, step=0)
    for s in range(1, 1000):
        run.log_metrics({"x": float(s)}, step=s)
    run.flush()  # the first 1,000 points are stored
    meta = tracker.backend.meta
    original = meta.log_metrics
    def flagged(run_id, points):
        Path(marker + ".tmp").write_text(run_id)
        os.replace(marker + ".tmp", marker)  # whole, never seen half-written
        return original(run_id, points)
    meta.log_metrics = flagged
    for s in range(1000, 101_000):  # the 100,000th point wakes the background writer
        run.log_metrics({"x": float(s)}, step=s)
    time.sleep(3600)
    """
)


def _spawn(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            pytest.fail(f"the child exited with {proc.returncode} before the marker:\n{out}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no marker after {timeout_s} s")
        time.sleep(0.01)


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("store_kind", ["local", "s3"])
def test_sigkill_during_an_upload_leaves_no_dangling_reference(store_kind, tmp_path, request):
    db = tmp_path / "t.db"
    env = {}
    if store_kind == "local":
        store_spec = str(tmp_path / "artifacts")
    else:
        s3 = request.getfixturevalue("s3_store")
        server = request.getfixturevalue("s3_server")
        creds = server.credentials()
        env = {
            "AWS_ACCESS_KEY_ID": creds["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": creds["aws_secret_access_key"],
        }
        store_spec = f"s3://{s3.bucket}/tracking?endpoint_url={server.endpoint}"
    src = tmp_path / "big.bin"
    src.write_bytes(np.random.default_rng(7).bytes(24 << 20))  # two 16 MiB parts on S3
    marker = tmp_path / "marker"
    proc = _spawn(UPLOADER, str(db), store_spec, str(src), str(marker), env=env)
    _wait_for(marker, proc)
    _kill(proc)
    run_id = marker.read_text()

    store = LocalArtifactStore(store_spec) if store_kind == "local" else s3
    backend = EmbeddedBackend(db, store)  # opens cleanly after the kill
    with backend.meta.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Artifact)) == 0
        intents = conn.scalar(select(func.count()).select_from(Upload))
    # S3 hashes before uploading, so its intent was recorded; locally the hash is known
    # only at the end of the stream, which the kill never reached.
    assert intents == (1 if store_kind == "s3" else 0)
    assert list(store.list_objects()) == []  # nothing half-written under an object name
    partial = (
        len(list((tmp_path / "artifacts" / "tmp").glob("*.part")))
        if store_kind == "local"
        else len(s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []))
    )
    assert partial == 1
    report = collect(backend.meta, store, soft_delete_grace_s=0, upload_grace_s=0)
    assert report.partial_uploads == 1 and report.orphans == []
    # The run carries on: the same file logs and downloads intact.
    ref = backend.log_artifact(run_id, src, "big.bin")
    assert backend.download_artifact(run_id, "big.bin", tmp_path / "out.bin").read_bytes() == (
        src.read_bytes()
    )
    assert [o.sha256 for o in store.list_objects()] == [ref.sha256]


@pytest.mark.parametrize("db_kind", ["sqlite", "postgresql"])
def test_sigkill_during_a_batch_flush_keeps_the_batch_whole_or_not_at_all(
    db_kind, tmp_path, request, seed
):
    db = str(tmp_path / "t.db") if db_kind == "sqlite" else request.getfixturevalue("pg_url")
    marker = tmp_path / "marker"
    proc = _spawn(FLUSHER, db, str(tmp_path / "artifacts"), str(marker))
    _wait_for(marker, proc)
    # Somewhere inside the 100,000-point transaction (it takes longer than this on 2 cores).
    time.sleep(float(np.random.default_rng(seed).uniform(0.0, 0.3)))
    _kill(proc)
    run_id = marker.read_text()
    if db_kind == "sqlite":
        with sqlite3.connect(db) as raw:
            assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    backend = EmbeddedBackend(db, tmp_path / "artifacts")
    with backend.meta.engine.connect() as conn:
        n = conn.scalar(select(func.count()).select_from(Metric).where(Metric.run_id == run_id))
    assert n in (1000, 101_000), n  # one transaction per batch
    steps = [s for s, _, _ in backend.metric_history(run_id, "x")]
    assert steps == list(range(n))
    assert backend.get_run(run_id).metrics == {"x": float(n - 1)}
