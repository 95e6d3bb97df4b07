"""The hot cache: LRU order, the byte bound, pinning, hit/miss counters, verification."""

from __future__ import annotations

from pathlib import Path

import pytest

from reference_impls.tracking.artifacts import LocalArtifactStore
from reference_impls.tracking.cache import HotCache
from reference_impls.tracking.errors import ArtifactError


@pytest.fixture
def store(tmp_path: Path) -> LocalArtifactStore:
    return LocalArtifactStore(tmp_path / "store", fsync=False)


def _put(store: LocalArtifactStore, tmp_path: Path, data: bytes) -> tuple[str, int]:
    src = tmp_path / "src"
    src.write_bytes(data)
    sha, size, _ = store.put_file(src)
    return sha, size


def test_lru_eviction_keeps_the_bound_and_the_recently_used(store, tmp_path):
    cache = HotCache(tmp_path / "cache", max_bytes=3000)
    objs = [_put(store, tmp_path, bytes([i]) * 1000) for i in range(4)]
    for sha, size in objs[:3]:
        assert cache.fetch(sha, size, tmp_path / "out", store) is False  # misses
    assert cache.fetch(*objs[0], tmp_path / "out", store) is True  # hit: 0 is now newest
    cache.fetch(*objs[3], tmp_path / "out", store)  # evicts 1, the least recently used
    assert objs[1][0] not in cache and objs[0][0] in cache and objs[2][0] in cache
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions) == (1, 4, 1)
    assert stats.bytes_in_use == cache.disk_bytes() == 3000
    assert stats.hit_rate == pytest.approx(1 / 5)  # exact ratio of small integers


def test_pinned_entries_are_never_evicted_and_oversized_ones_bypass(store, tmp_path):
    cache = HotCache(tmp_path / "cache", max_bytes=2500)
    a, b, c = (_put(store, tmp_path, bytes([i]) * 1000) for i in range(3))
    cache.fetch(*a, tmp_path / "out", store)
    with cache.pinned([a[0]]):
        cache.fetch(*b, tmp_path / "out", store)
        cache.fetch(*c, tmp_path / "out", store)  # must evict b, not the pinned a
        assert a[0] in cache and b[0] not in cache
    big = _put(store, tmp_path, b"x" * 4000)
    assert cache.fetch(*big, tmp_path / "big", store) is False
    assert (tmp_path / "big").read_bytes() == b"x" * 4000  # served, not cached
    assert big[0] not in cache and cache.stats().bypasses == 1
    with pytest.raises(ArtifactError, match="not pinned"):
        cache.unpin(a[0])


def test_a_damaged_cache_file_is_dropped_and_fetched_again(store, tmp_path):
    cache = HotCache(tmp_path / "cache", max_bytes=10_000)
    sha, size = _put(store, tmp_path, b"good bytes" * 10)
    cache.fetch(sha, size, tmp_path / "out", store)
    (tmp_path / "cache" / sha).write_bytes(b"evil bytes" * 10)
    cache.fetch(sha, size, tmp_path / "out2", store)
    assert (tmp_path / "out2").read_bytes() == b"good bytes" * 10
    assert (tmp_path / "cache" / sha).read_bytes() == b"good bytes" * 10


def test_a_restart_adopts_files_and_respects_a_smaller_bound(store, tmp_path):
    cache = HotCache(tmp_path / "cache", max_bytes=5000)
    objs = [_put(store, tmp_path, bytes([i]) * 1000) for i in range(4)]
    for o in objs:
        cache.fetch(*o, tmp_path / "out", store)
    (tmp_path / "cache" / "leftover.part").write_bytes(b"half")
    again = HotCache(tmp_path / "cache", max_bytes=2000)
    assert again.stats().bytes_in_use == again.disk_bytes() == 2000
    assert not (tmp_path / "cache" / "leftover.part").exists()
    with pytest.raises(ValueError, match="positive number of bytes"):
        HotCache(tmp_path / "c2", max_bytes=0)
