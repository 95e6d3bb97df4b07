"""A shard fetch's size check against the manifest, with a scripted source (no server).

A connection cut inside a response's headers can end in the middle of
"Content-Length: 37888" and still parse, as 37: one response's size is not evidence that the
object changed. CI saw exactly this through the fault-injecting proxy.
"""

from __future__ import annotations

import hashlib
import io

import pytest

from reference_impls.data.errors import ManifestMismatchError
from reference_impls.data.manifest import ShardInfo
from reference_impls.data.metrics import Metrics
from reference_impls.data.stream import RetryConfig, ShardFetch

DATA = bytes(range(256)) * 8  # 2048 bytes: a manifest shard is at least 1024


class _Reader:
    def __init__(self, data: bytes, start: int, claimed: int) -> None:
        self.total_size = claimed
        self._body = io.BytesIO(data[start:])

    def read(self, n: int) -> bytes:
        return self._body.read(n)

    def close(self) -> None:
        pass


class _ScriptedSource:
    """Each open_range claims the next size of ``claims``; the true size once they run out."""

    def __init__(self, data: bytes, claims: list[int]) -> None:
        self.data, self.claims, self.opened = data, list(claims), 0

    def open_range(self, name: str, start: int) -> _Reader:
        self.opened += 1
        claimed = self.claims.pop(0) if self.claims else len(self.data)
        return _Reader(self.data, start, claimed)

    def location(self, name: str) -> str:
        return f"scripted://{name}"


def _fetch(source: _ScriptedSource) -> tuple[bytes, Metrics]:
    shard = ShardInfo(
        name="shard-0.tar", size=len(DATA), num_samples=1, sha256=hashlib.sha256(DATA).hexdigest()
    )
    metrics = Metrics()
    fetch = ShardFetch(
        source,
        shard,
        cache=None,
        retry=RetryConfig(max_attempts=5, backoff_initial_s=0.001, backoff_max_s=0.001),
        chunk_bytes=512,
        buffer_bytes=1 << 16,
        verify=True,
        metrics=metrics,
    ).start()
    try:
        return b"".join(bytes(c) for c in fetch.chunks()), metrics
    finally:
        fetch.release()
        fetch.join(5)


def test_one_response_claiming_a_wrong_size_is_asked_again():
    source = _ScriptedSource(DATA, claims=[37])  # "Content-Length: 37" of a cut "37888"
    data, metrics = _fetch(source)
    assert data == DATA
    assert source.opened == 2 and metrics.retries == 1


def test_two_responses_in_a_row_claiming_the_same_wrong_size_are_a_manifest_mismatch():
    source = _ScriptedSource(DATA, claims=[4096, 4096])
    with pytest.raises(ManifestMismatchError, match="has 4096 bytes but the manifest says 2048"):
        _fetch(source)
    assert source.opened == 2


def test_different_wrong_sizes_keep_being_asked_again_until_one_is_right():
    source = _ScriptedSource(DATA, claims=[37, 378, 3788])
    data, metrics = _fetch(source)
    assert data == DATA and metrics.retries == 3
