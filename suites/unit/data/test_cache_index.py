"""The cache's per-shard sample index (``reference_impls/data/shardindex.py``) and how the cache
and the dataset use it, over local datasets.

What must hold: an index yields exactly the samples the tar parser yields (same keys, bytes,
member order) for every tar layout the parser reads; a damaged, truncated, stale or missing
index is never used (the tar is parsed again and the index rebuilt); a damaged cached tar is
still caught before any of its samples is yielded; indexes live and die with their files
(eviction, clear, stale parts, the size limit); a mid-shard resume through the index yields
exactly the rest.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path
from typing import Any

import pytest

import reference_impls.data.dataset as dataset_module
from reference_impls.data import DatasetConfig, ShardedDataset, ShardInfo, build_manifest
from reference_impls.data.cache import ShardCache, index_path
from reference_impls.data.shardindex import INLINE_MAX, ShardIndex
from reference_impls.data.tario import END_OF_ARCHIVE, iter_samples, sample_bytes

# Member sizes around the inline limit and the 512-byte block.
SIZES = [0, 1, 2, INLINE_MAX - 1, INLINE_MAX, INLINE_MAX + 1, 511, 512, 513, 3000]


def odd_archive(rng: random.Random, n: int, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    """A tar with what the parser handles beyond the writer's output: long names, mixed-case
    and multi-dot extensions, varying member sets per sample, keyless and metadata members, a
    directory, a non-UTF-8 name byte, empty members."""
    buf = io.BytesIO()
    with tarfile.open(
        fileobj=buf, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape"
    ) as tf:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))

        for i in range(n):
            key = f"s{i:03d}"
            if i % 5 == 1:
                key = "d" * 110 + f"/{key}"  # long name: ustar prefix, GNU 'L', pax path
            if i % 7 == 3:
                key += "\udcff"  # a raw 0xff byte in the name (surrogateescape)
            exts = rng.sample(["bin", "CLS", "seg.png", "json", "txt"], rng.randint(1, 4))
            for j, ext in enumerate(exts):
                # The first member is one byte: the index's inline section is never empty (with
                # every size drawn it was, about once in 900 seeds, and the damage tests need it).
                add(f"{key}.{ext}", rng.randbytes(1 if i == j == 0 else rng.choice(SIZES)))
            if i % 4 == 2:
                add("README", b"not a sample member")
                add("__meta__/x.json", b"{}")
                d = tarfile.TarInfo("somedir")
                d.type = tarfile.DIRTYPE
                tf.addfile(d)
    return buf.getvalue()


def identity(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "crc": zlib.crc32(data), "sha256": hashlib.sha256(data).hexdigest()}


def items(samples: list[dict[str, Any]]) -> list[list[tuple[str, Any]]]:
    """Samples as ordered (key, value) lists: equality then also checks the key order."""
    return [list(s.items()) for s in samples]


def read_all(index: ShardIndex, path: Path) -> list[dict[str, Any]]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return [index.read(fd, i) for i in range(len(index))]
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the index itself
@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_an_index_round_trips_and_reads_exactly_what_the_parser_yields(tmp_path, seed, fmt):
    data = odd_archive(random.Random(seed), 40, fmt)
    path = tmp_path / "s.tar"
    path.write_bytes(data)
    index = ShardIndex.scan(data, "s.tar")
    encoded = index.encode(**identity(data))
    assert encoded is not None
    decoded = ShardIndex.decode(encoded, **identity(data))
    assert decoded == index
    parsed = list(iter_samples([data], "s.tar"))
    assert len(parsed) == 40
    assert items(read_all(decoded, path)) == items(parsed)
    # Mid-shard starts (resume, segments of a rank) find their members.
    fd = os.open(path, os.O_RDONLY)
    try:
        for i in (39, 17, 1, 0):
            assert list(decoded.read(fd, i).items()) == list(parsed[i].items())
    finally:
        os.close(fd)


def test_an_index_of_uniform_samples_reads_them_like_the_parser(tmp_path, seed):
    rng = random.Random(seed)
    parts = []
    for i in range(30):
        parts += sample_bytes(
            f"k{i:03d}", {"bin": rng.randbytes(rng.choice(SIZES)), "cls": str(i).encode()}
        )
    data = b"".join(parts) + END_OF_ARCHIVE
    path = tmp_path / "u.tar"
    path.write_bytes(data)
    decoded = ShardIndex.decode(
        ShardIndex.scan(data, "u").encode(**identity(data)), **identity(data)
    )
    assert decoded is not None and len(set(map(id, decoded.layouts))) == 1  # one shared layout
    assert items(read_all(decoded, path)) == items(list(iter_samples([data], "u")))


def test_keys_that_cannot_be_stored_exactly_give_no_index_file():
    index = ShardIndex(["a\0b"], [("txt",)], [512], [1], [b"x"])
    assert index.encode(size=2048, crc=0, sha256="0" * 64) is None


def test_a_corrupt_or_truncated_index_file_is_never_accepted(seed):
    data = odd_archive(random.Random(seed), 6)
    ident = identity(data)
    good = ShardIndex.scan(data, "s").encode(**ident)
    assert good is not None and ShardIndex.decode(good, **ident) is not None
    for pos in range(len(good)):  # every single-bit flip
        damaged = bytearray(good)
        damaged[pos] ^= 1 << (pos % 8)
        assert ShardIndex.decode(bytes(damaged), **ident) is None, f"flip at byte {pos} accepted"
    for cut in range(len(good)):
        assert ShardIndex.decode(good[:cut], **ident) is None, f"truncation to {cut} accepted"
    assert ShardIndex.decode(good + b"\0", **ident) is None
    # The index of another tar (a stale one): intact, but not this tar's.
    for key, value in [
        ("size", ident["size"] + 512),
        ("crc", ident["crc"] ^ 1),
        ("sha256", hashlib.sha256(b"other").hexdigest()),
    ]:
        assert ShardIndex.decode(good, **{**ident, key: value}) is None


def _resigned(body: bytearray) -> bytes:
    return bytes(body) + hashlib.sha256(body).digest()


@pytest.mark.parametrize(
    "damage", ["start past the end", "overlap", "counts", "ext id", "inline length", "magic"]
)
def test_an_intact_index_whose_content_does_not_fit_the_tar_is_refused(seed, damage):
    data = odd_archive(random.Random(seed), 6)
    ident = identity(data)
    body = bytearray(ShardIndex.scan(data, "s").encode(**ident)[:-32])  # type: ignore[index]
    _, _, _, _, n, m, e, _ = struct.unpack_from("<8sQI32sIIII", body)
    head = struct.calcsize("<8sQI32sIIII")
    counts, ids, starts = head, head + 4 * n, head + 4 * n + 4 * m
    if damage == "start past the end":
        # One byte past the end: a last member of size 0 starting exactly at the end would be
        # harmless (it reads b""), and the decoder accepts it.
        struct.pack_into("<Q", body, starts + 8 * (m - 1), len(data) + 1)
    elif damage == "overlap":  # the member after the first non-empty one starts inside it
        sizes = struct.unpack_from(f"<{m}Q", body, starts + 8 * m)
        j = next(i for i in range(m - 1) if sizes[i] > 0)
        struct.pack_into(
            "<Q", body, starts + 8 * (j + 1), struct.unpack_from("<Q", body, starts + 8 * j)[0]
        )
    elif damage == "counts":
        struct.pack_into("<I", body, counts, struct.unpack_from("<I", body, counts)[0] + 1)
    elif damage == "ext id":
        struct.pack_into("<I", body, ids, e)
    elif damage == "inline length":  # one inline byte fewer than the member sizes say
        pos = _inline_length_at(body, n, m)
        (length,) = struct.unpack_from("<Q", body, pos)
        assert length > 0
        struct.pack_into("<Q", body, pos, length - 1)
        del body[-1]
    elif damage == "magic":
        body[:8] = b"MLHIDX99"
    assert ShardIndex.decode(_resigned(body), **ident) is None


def _inline_length_at(body: bytearray, n: int, m: int) -> int:
    """Offset of the inline section's length field (after the key and extension tables)."""
    pos = struct.calcsize("<8sQI32sIIII") + 4 * n + 20 * m
    for _ in range(2):
        (length,) = struct.unpack_from("<I", body, pos)
        pos += 4 + length
    return pos


# --------------------------------------------------------------------------- through the cache
@pytest.fixture
def odd_dataset(tmp_path, seed) -> tuple[Path, Any]:
    """Five shards of odd tars (see odd_archive) in a local directory, and their manifest."""
    root = tmp_path / "ds"
    root.mkdir()
    rng = random.Random(seed)
    for s in range(5):
        (root / f"shard-{s}.tar").write_bytes(odd_archive(rng, 12 + 3 * s))
    return root, build_manifest(root)


def cached(root: Path, manifest: Any, cache: Path, **kw: Any) -> ShardedDataset:
    config = DatasetConfig(
        shuffle_buffer=0,
        shuffle_shards=False,
        cache_dir=str(cache),
        cache_max_bytes=kw.pop("cache_max_bytes", 64 << 20),
        **kw,
    )
    return ShardedDataset(root, config, manifest=manifest)


class ParseCounter:
    """Counts the dataset's calls of the tar parser (a cache hit read by index makes none)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = dataset_module.iter_samples

        def counting(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(dataset_module, "iter_samples", counting)


def test_a_cache_hit_reads_through_the_index_exactly_the_samples_of_a_parse(
    odd_dataset, tmp_path, monkeypatch
):
    root, manifest = odd_dataset
    uncached = list(
        ShardedDataset(
            root, DatasetConfig(shuffle_buffer=0, shuffle_shards=False), manifest=manifest
        )
    )
    ds = cached(root, manifest, tmp_path / "cache")
    first = list(ds)  # misses: every shard enters the cache with its index
    tars = sorted((tmp_path / "cache").glob("*.tar"))
    assert len(tars) == len(manifest.shards)
    assert all(index_path(t).exists() for t in tars)
    parses = ParseCounter(monkeypatch)
    ds.metrics.reset()
    second = list(ds)
    assert ds.metrics.cache_hits == len(manifest.shards)
    assert ds.metrics.cache_index_rebuilds == 0
    assert parses.calls == 0, "a cache hit parsed its tar instead of reading its index"
    assert items(second) == items(first) == items(uncached)


@pytest.mark.parametrize(
    "damage", ["missing", "empty", "truncated", "flipped bit", "another shard's index"]
)
def test_a_bad_index_is_rebuilt_from_the_tar_and_the_samples_are_identical(
    odd_dataset, tmp_path, monkeypatch, damage
):
    root, manifest = odd_dataset
    cache_dir = tmp_path / "cache"
    ds = cached(root, manifest, cache_dir)
    first = list(ds)
    cache = ShardCache(cache_dir, 64 << 20)
    victim = manifest.shards[2]
    idx = index_path(cache.path_for(victim))  # type: ignore[arg-type]
    good = idx.read_bytes()
    if damage == "missing":
        idx.unlink()
    elif damage == "empty":
        idx.write_bytes(b"")
    elif damage == "truncated":
        idx.write_bytes(good[: len(good) // 2])
    elif damage == "flipped bit":
        idx.write_bytes(good[:40] + bytes([good[40] ^ 0x10]) + good[41:])
    else:
        other = index_path(cache.path_for(manifest.shards[1]))  # type: ignore[arg-type]
        idx.write_bytes(other.read_bytes())
    parses = ParseCounter(monkeypatch)
    ds.metrics.reset()
    second = list(ds)
    assert items(second) == items(first)
    assert ds.metrics.cache_index_rebuilds == 1 and ds.metrics.cache_corrupt == 0
    assert parses.calls == 0  # rebuilt by scanning the verified tar, then read by index
    assert idx.read_bytes() == good, "the rebuilt index differs from the one built at admission"


@pytest.mark.parametrize("verify", ["crc32", "sha256"])
@pytest.mark.parametrize("where", ["member data", "tar header"])
def test_a_damaged_cached_tar_is_caught_before_its_samples_even_with_an_intact_index(
    odd_dataset, tmp_path, verify, where
):
    root, manifest = odd_dataset
    cache_dir = tmp_path / "cache"
    ds = cached(root, manifest, cache_dir, cache_verify=verify)
    first = list(ds)
    cache = ShardCache(cache_dir, 64 << 20)
    victim = manifest.shards[3]
    path = cache.path_for(victim)
    assert path is not None
    index = cache.load_index(path, victim)
    assert index is not None
    big = max(range(len(index.sizes)), key=index.sizes.__getitem__)
    # Inside the largest member's data (read with pread, not from the index), or in a header.
    offset = index.starts[big] + index.sizes[big] // 2 if where == "member data" else 100
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
    ds.metrics.reset()
    second = list(ds)
    assert ds.metrics.cache_corrupt == 1
    assert ds.metrics.cache_hits == len(manifest.shards) - 1
    assert items(second) == items(first), "a sample of the damaged copy was yielded"
    repaired = cache.lookup(victim)  # fetched again, admitted again, with its index
    assert repaired is not None and repaired.index is not None
    repaired.close()


def test_indexes_are_evicted_and_cleared_with_their_files_and_count_against_the_limit(
    odd_dataset, tmp_path
):
    root, manifest = odd_dataset
    cache_dir = tmp_path / "cache"
    sizes = sorted(s.size for s in manifest.shards)
    limit = sizes[-1] + sizes[-2] + (32 << 10)  # two shards and their indexes, not five
    ds = ShardedDataset(
        root,
        DatasetConfig(
            shuffle_buffer=0,
            seed=3,
            cache_dir=str(cache_dir),
            cache_max_bytes=limit,
            prefetch_depth=1,
        ),
        manifest=manifest,
    )
    cache = ShardCache(cache_dir, limit)
    peak = 0
    for epoch in range(3):
        ds.set_epoch(epoch)
        for _ in ds:
            peak = max(peak, cache.used_bytes())
    assert ds.metrics.cache_evictions > 0
    assert 0 < peak <= limit
    tars = {p.stem for p in cache_dir.glob("*.tar")}
    idxs = {p.stem for p in cache_dir.glob("*.idx")}
    assert idxs and idxs <= tars, f"indexes outlived their files: {idxs - tars}"
    on_disk = sum(p.stat().st_size for p in cache_dir.iterdir() if p.suffix in (".tar", ".idx"))
    assert cache.used_bytes() == on_disk
    (cache_dir / "notes.idx").write_text("not ours")
    (cache_dir / f"{'a' * 64}-0000000a.idx.bak").write_text("not ours either")
    cache.clear()
    assert sorted(p.name for p in cache_dir.iterdir() if not p.name.startswith(".")) == [
        f"{'a' * 64}-0000000a.idx.bak",
        "notes.idx",
    ]


def test_stale_index_parts_and_orphan_indexes_are_removed_and_nothing_else(tmp_path):
    cache_dir = tmp_path / "cache"
    cache = ShardCache(cache_dir, 1 << 20)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    stem = f"{'b' * 64}-0123abcd"
    removed = [
        f"{stem}.idx",  # no tar beside it
        f"{stem}.idx.{dead_pid}.1a2b3c4d.part",
    ]
    kept = [
        f"{'c' * 64}-0123abcd.tar",
        f"{'c' * 64}-0123abcd.idx",
        f"{stem}.idx.{os.getpid()}.1a2b3c4d.part",  # being written by a live process
        "other.idx",
        f"{stem}.idx.old",
        "README",
    ]
    for name in removed + kept:
        (cache_dir / name).write_bytes(b"x")
    writer = cache.reserve(ShardInfo(name="n.tar", size=2048, num_samples=1, sha256="d" * 64))
    assert writer is not None
    writer.abort()
    assert sorted(p.name for p in cache_dir.iterdir() if not p.name.startswith(".")) == sorted(kept)


@pytest.mark.parametrize("shuffle_buffer", [0, 7])
def test_a_resume_in_the_middle_of_a_shard_reads_exactly_the_rest_through_the_index(
    odd_dataset, tmp_path, monkeypatch, shuffle_buffer
):
    root, manifest = odd_dataset
    cache_dir = tmp_path / "cache"

    def make(cache: bool) -> ShardedDataset:
        config = DatasetConfig(
            seed=5,
            shuffle_buffer=shuffle_buffer,
            shuffle_shards=False,
            cache_dir=str(cache_dir) if cache else None,
            cache_max_bytes=(64 << 20) if cache else None,
        )
        ds = ShardedDataset(root, config, manifest=manifest)
        ds.set_epoch(1)
        return ds

    full = list(make(cache=False))
    list(make(cache=True))  # warms the cache
    consumed = manifest.shards[0].num_samples + 5  # inside the second shard
    first = make(cache=True)
    for _, sample in zip(range(consumed), first, strict=False):
        first.record(sample)
    parses = ParseCounter(monkeypatch)
    resumed = make(cache=True)
    resumed.load_state_dict(first.state_dict())
    rest = list(resumed)
    assert parses.calls == 0 and resumed.metrics.cache_index_rebuilds == 0
    assert resumed.metrics.cache_hits >= 1
    assert items(rest) == items(full[consumed:])


@pytest.mark.parametrize("world_size", [3, 4])
def test_segments_starting_mid_shard_read_the_same_samples_from_the_index(
    odd_dataset, tmp_path, monkeypatch, world_size
):
    root, manifest = odd_dataset
    cache_dir = tmp_path / "cache"
    list(cached(root, manifest, cache_dir))  # warms the cache
    parses = ParseCounter(monkeypatch)
    starts_mid_shard = False
    for rank in range(world_size):
        kw: dict[str, Any] = {
            "seed": 11,
            "shuffle_buffer": 0,
            "rank": rank,
            "world_size": world_size,
        }
        plain = ShardedDataset(root, DatasetConfig(**kw), manifest=manifest)
        hit = ShardedDataset(
            root,
            DatasetConfig(**kw, cache_dir=str(cache_dir), cache_max_bytes=64 << 20),
            manifest=manifest,
        )
        starts_mid_shard |= any(seg.start > 0 for seg in plain.plan())
        want = list(plain)
        calls = parses.calls
        got = list(hit)
        assert parses.calls == calls, "a cache hit parsed its tar"
        assert hit.metrics.cache_hits > 0 and hit.metrics.cache_index_rebuilds == 0
        assert items(got) == items(want)
    assert starts_mid_shard
