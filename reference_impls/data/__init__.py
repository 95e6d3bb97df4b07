"""Streaming sharded dataset: WebDataset-layout tar shards from S3 or local disk.

Write (:mod:`.writer`): samples -> tar shards cut at a target size + ``manifest.json``
(names, sizes, sample counts, sha256), to a directory or ``s3://bucket/prefix`` (multipart).

Read (:mod:`.dataset`): :class:`ShardedDataset`, a torch ``IterableDataset``:

* deterministic assignment over (rank, world size) and DataLoader workers, exactly once per
  epoch over all ranks, equal per-rank lengths (pad or drop), per-epoch reshuffle from a seed,
  a bounded shuffle buffer (:mod:`.assignment`);
* streaming: samples are yielded while their shard downloads; a cut connection resumes with a
  ranged GET from the last byte, with bounded retries and backoff (:mod:`.stream`);
* a local disk cache with a size limit, written atomically while streaming, verified on
  use, LRU eviction that never evicts a shard being read (:mod:`.cache`);
* prefetch threads with a configurable depth; mid-epoch resume; metrics and a progress line;
* compatible both ways with the ``webdataset`` package (:mod:`.tario`).

Modules: ``tario`` (tar parse/write), ``manifest``, ``sources`` (local, S3), ``writer``,
``assignment`` (pure planning logic), ``stream`` (fetch threads, retries), ``cache``,
``metrics``, ``dataset``, ``seaweedfs`` (a loopback S3 server for tests and benchmarks),
``bench`` (``python -m reference_impls.data.bench``).
"""

from __future__ import annotations

from typing import Any

from .assignment import Segment, ShuffleSchedule, epoch_shard_order, plan_worker, rank_length
from .errors import (
    DataError,
    ManifestError,
    ManifestMismatchError,
    ShardFormatError,
    ShardNotFoundError,
    ShardReadError,
    StorageUnavailableError,
)
from .manifest import MANIFEST_NAME, Manifest, ShardInfo, build_manifest
from .metrics import Metrics, ProgressDisplay
from .s3 import S3Config, S3Source
from .sources import LocalSource, open_source
from .stream import RetryConfig
from .tario import iter_samples
from .writer import ShardWriter, WriterConfig

__all__ = [
    "MANIFEST_NAME",
    "DataError",
    "DatasetConfig",
    "LocalSource",
    "Manifest",
    "ManifestError",
    "ManifestMismatchError",
    "Metrics",
    "ProgressDisplay",
    "RetryConfig",
    "S3Config",
    "S3Source",
    "Segment",
    "ShardFormatError",
    "ShardInfo",
    "ShardNotFoundError",
    "ShardReadError",
    "ShardWriter",
    "ShardedDataset",
    "ShuffleSchedule",
    "StorageUnavailableError",
    "WriterConfig",
    "build_manifest",
    "epoch_shard_order",
    "iter_samples",
    "open_source",
    "plan_worker",
    "rank_length",
]


def __getattr__(name: str) -> Any:
    # The dataset imports torch (~1.5 s): only when it is asked for, so that writing shards,
    # planning and the asv benchmarks of the CPU-side paths do not pay for it.
    if name in ("ShardedDataset", "DatasetConfig"):
        from . import dataset

        return getattr(dataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
