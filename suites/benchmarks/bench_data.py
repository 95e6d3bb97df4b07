"""CPU-side paths of the streaming dataset (reference_impls/data): parsing, writing, local
and cache-hit epochs, planning.

The network paths (S3 streaming vs raw boto3 GETs and the webdataset package, time to first
sample) need a server and are measured side by side by ``python -m reference_impls.data.bench``
(docs/benchmarks/data.md); these benchmarks gate the code those paths spend their CPU in.
Inputs are seeded; shards for the epoch benchmarks are written once per run in
``setup_cache`` (asv's temporary folder) and only read afterwards.
"""

from __future__ import annotations

import hashlib
import os
import zlib

import numpy as np

from reference_impls.data import ShardWriter, WriterConfig, iter_samples, plan_worker
from reference_impls.data.assignment import ShuffleSchedule
from reference_impls.data.shardindex import ShardIndex
from reference_impls.data.tario import END_OF_ARCHIVE, sample_bytes

SEED = 20261130
SHARD_BYTES = 32_000_000

# Built once per process, only appended to (asv re-runs setup before every sample).
_SHARDS: dict[int, bytes] = {}


def _payloads(sample_size: int, count: int) -> list[bytes]:
    rng = np.random.default_rng(SEED + sample_size)
    pool = rng.bytes(max(sample_size * 64, 1 << 20))
    offsets = rng.integers(0, len(pool) - sample_size, count)
    return [pool[o : o + sample_size] for o in offsets]


def _shard(sample_size: int) -> bytes:
    """One in-memory shard of ~32 MB: samples of a ``bin`` payload and a ``cls`` label."""
    if sample_size not in _SHARDS:
        count = SHARD_BYTES // (sample_size + 1024)
        parts: list[bytes] = []
        for i, payload in enumerate(_payloads(sample_size, count)):
            parts += sample_bytes(f"{i:08d}", {"bin": payload, "cls": str(i % 1000).encode()})
        _SHARDS[sample_size] = b"".join(parts) + END_OF_ARCHIVE
    return _SHARDS[sample_size]


class TarParse:
    """``iter_samples`` over a 32 MB shard in 1 MiB chunks (the streaming reader's parse)."""

    # Pure CPU, but one side ran past 300 s under Valgrind (docs/perf.md, "Instruction counts").
    harness_counts = False

    params = [1_000, 100_000]
    param_names = ["sample_bytes"]

    def setup(self, sample_size):
        data = _shard(sample_size)
        view = memoryview(data)
        self.chunks = [view[i : i + (1 << 20)] for i in range(0, len(data), 1 << 20)]

    def time_parse_32mb(self, sample_size):
        for _ in iter_samples(self.chunks, "bench.tar"):
            pass


class ShardIndexing:
    """A cached shard's sample index: built once when the shard enters the cache (a scan of
    its headers) and loaded (read, checked, decoded) by every cache hit."""

    params = [1_000, 100_000]
    param_names = ["sample_bytes"]

    def setup(self, sample_size):
        self.data = _shard(sample_size)
        self.identity = {
            "size": len(self.data),
            "crc": zlib.crc32(self.data),
            "sha256": hashlib.sha256(self.data).hexdigest(),
        }
        self.encoded = ShardIndex.scan(self.data, "bench.tar").encode(**self.identity)

    def time_scan_32mb(self, sample_size):
        ShardIndex.scan(self.data, "bench.tar")

    def time_load(self, sample_size):
        ShardIndex.decode(self.encoded, **self.identity)


class TarWrite:
    """``sample_bytes``: the tar pieces of 1,000 samples (the writer's per-sample work)."""

    params = [1_000, 100_000]
    param_names = ["sample_bytes"]

    def setup(self, sample_size):
        self.payloads = _payloads(sample_size, 1000)

    def time_encode_1000_samples(self, sample_size):
        for i, payload in enumerate(self.payloads):
            sample_bytes(f"{i:08d}", {"bin": payload, "cls": b"1"})


class _LocalShards:
    """Four ~32 MB shards of 100 KB samples on local disk, and a warm cache of them."""

    harness_counts = False  # reads files: not an instruction count (README.md, 9)

    timeout = 300

    def setup_cache(self):
        from reference_impls.data import DatasetConfig, ShardedDataset

        root = os.path.abspath("data_bench")
        payloads = _payloads(100_000, 1260)
        with ShardWriter(
            os.path.join(root, "shards"), WriterConfig(target_shard_bytes=SHARD_BYTES)
        ) as w:
            for i, payload in enumerate(payloads):
                w.write({"__key__": f"{i:08d}", "bin": payload, "cls": str(i % 1000)})
        cache = os.path.join(root, "cache")
        config = DatasetConfig(shuffle_buffer=0, cache_dir=cache, cache_max_bytes=1 << 30)
        for _ in ShardedDataset(os.path.join(root, "shards"), config):
            pass
        return root


class LocalEpoch(_LocalShards):
    """One epoch of ``ShardedDataset`` over a local directory (no cache), 126 MB."""

    params = [0, 1000]
    param_names = ["shuffle_buffer"]

    def setup(self, root, shuffle_buffer):
        from reference_impls.data import DatasetConfig, ShardedDataset

        self.dataset = ShardedDataset(
            os.path.join(root, "shards"), DatasetConfig(shuffle_buffer=shuffle_buffer, seed=SEED)
        )

    def time_epoch(self, root, shuffle_buffer):
        for _ in self.dataset:
            pass


class CacheHitEpoch(_LocalShards):
    """One epoch served from a warm cache, per verification mode (checked before use), read
    through each shard's sample index (one pread per member, no tar parsing)."""

    params = ["crc32", "sha256", "size"]
    param_names = ["cache_verify"]

    def setup(self, root, cache_verify):
        from reference_impls.data import DatasetConfig, ShardedDataset

        config = DatasetConfig(
            shuffle_buffer=0,
            cache_dir=os.path.join(root, "cache"),
            cache_max_bytes=1 << 30,
            cache_verify=cache_verify,
        )
        self.dataset = ShardedDataset(os.path.join(root, "shards"), config)

    def time_epoch(self, root, cache_verify):
        for _ in self.dataset:
            pass


class Planning:
    """What every process computes at the start of an epoch or a resume."""

    def setup(self):
        rng = np.random.default_rng(SEED)
        self.counts = [int(c) for c in rng.integers(500, 700, 10_000)]  # 10k shards, ~6M samples

    def time_plan_worker_10k_shards_64_ranks_8_workers(self):
        plan_worker(self.counts, seed=1, epoch=3, rank=17, world_size=64, worker=5, num_workers=8)

    def time_replay_shuffle_100k_consumed(self):
        ShuffleSchedule(120_000, 2000, "bench").advance(100_000)
