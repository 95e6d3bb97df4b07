"""Properties of the cache's per-shard sample index over generated inputs (hypothesis).

Any archive: the index survives its file format and reads back exactly the samples the tar
parser yields, from any sample on. Any resume point, shuffle buffer and rank: an epoch read
from a warm cache (through the indexes) yields exactly what the uncached reader yields.
"""

from __future__ import annotations

import hashlib
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference_impls.data.dataset as dataset_module
from reference_impls.data import DatasetConfig, ShardedDataset, ShardWriter, WriterConfig
from reference_impls.data.shardindex import INLINE_MAX, ShardIndex
from reference_impls.data.tario import END_OF_ARCHIVE, iter_samples, sample_bytes

member_sizes = st.one_of(st.integers(0, 2 * INLINE_MAX), st.integers(INLINE_MAX, 5000))
samples_strategy = st.lists(
    st.dictionaries(
        st.sampled_from(["bin", "cls", "json", "seg.png", "a.b.c"]),
        member_sizes,
        min_size=1,
        max_size=4,
    ),
    min_size=0,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(layouts=samples_strategy, skip=st.integers(0, 26), fill=st.integers(0, 255))
def test_an_index_reads_exactly_what_the_parser_yields_from_any_sample_on(layouts, skip, fill):
    parts = []
    for i, fields in enumerate(layouts):
        parts += sample_bytes(
            f"k{i}",
            {ext: bytes([(fill + i + len(ext)) % 256]) * size for ext, size in fields.items()},
        )
    data = b"".join(parts) + END_OF_ARCHIVE
    ident = {"size": len(data), "crc": zlib.crc32(data), "sha256": hashlib.sha256(data).hexdigest()}
    index = ShardIndex.scan(data, "s.tar")
    encoded = index.encode(**ident)
    assert encoded is not None
    decoded = ShardIndex.decode(encoded, **ident)
    assert decoded == index
    want = [list(s.items()) for s in iter_samples([data], "s.tar", skip=skip)]
    with tempfile.NamedTemporaryFile() as f:
        f.write(data)
        f.flush()
        got = [list(decoded.read(f.fileno(), i).items()) for i in range(skip, len(decoded))]
    assert got == want


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A local dataset with varying member sets, and a cache holding all of it."""
    root = tmp_path_factory.mktemp("ds")
    with ShardWriter(root, WriterConfig(target_shard_bytes=12_000)) as w:
        for i in range(150):
            sample = {"__key__": f"k{i:04d}", "txt": f"sample {i} " + "x" * (i * 37 % 900)}
            if i % 3 == 0:
                sample["cls"] = str(i % 10)
            w.write(sample)
    cache = tmp_path_factory.mktemp("cache")
    for _ in ShardedDataset(root, DatasetConfig(cache_dir=str(cache), cache_max_bytes=1 << 24)):
        pass
    assert len(list(cache.glob("*.idx"))) == len(list(root.glob("*.tar")))
    return root, cache


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(buffer_size=st.integers(0, 40), world_size=st.integers(1, 4), data=st.data())
def test_a_resumed_epoch_from_a_warm_cache_yields_what_the_uncached_reader_yields(
    warm, monkeypatch, buffer_size, world_size, data
):
    root, cache = warm
    rank = data.draw(st.integers(0, world_size - 1))
    kw = {
        "seed": 7,
        "shuffle_buffer": buffer_size,
        "rank": rank,
        "world_size": world_size,
        "prefetch_depth": data.draw(st.integers(0, 2)),
    }
    with_cache = {"cache_dir": str(cache), "cache_max_bytes": 1 << 24}

    def make(**extra: object) -> ShardedDataset:
        ds = ShardedDataset(root, DatasetConfig(**kw, **extra))  # type: ignore[arg-type]
        ds.set_epoch(3)
        return ds

    full = [list(s.items()) for s in make()]
    consumed = data.draw(st.integers(0, len(full)))
    first = make(**with_cache)
    for _, sample in zip(range(consumed), first, strict=False):
        first.record(sample)
    resumed = make(**with_cache)
    resumed.load_state_dict(first.state_dict())
    parsed = []
    real = dataset_module.iter_samples
    monkeypatch.setattr(
        dataset_module, "iter_samples", lambda *a, **k: parsed.append(1) or real(*a, **k)
    )
    rest = [list(s.items()) for s in resumed]
    monkeypatch.undo()
    assert not parsed and resumed.metrics.cache_index_rebuilds == 0
    if consumed == len(full):
        assert rest == full  # a finished epoch iterated again starts over
    else:
        assert rest == full[consumed:]
