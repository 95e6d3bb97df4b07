"""``ShardedDataset``: a torch ``IterableDataset`` streaming WebDataset-layout shards.

    ds = ShardedDataset("s3://bucket/train", DatasetConfig(
        seed=17, shuffle_buffer=2000, cache_dir="/nvme/cache", cache_max_bytes=500 << 30,
        s3=S3Config(endpoint_url="http://127.0.0.1:8333")))
    loader = DataLoader(ds, batch_size=64, num_workers=4)
    for epoch in range(start_epoch, epochs):
        ds.set_epoch(epoch)                    # before iter(loader): workers copy the dataset
        for batch in loader:
            step(batch)                        # batch["jpg"]: list of bytes, batch["__pad__"]
            ds.record(batch)                   # marks these samples consumed (for resume)
            if want_checkpoint:
                save({"data": ds.state_dict(), ...})

Per process: rank and world size come from the config, else from ``torch.distributed`` when it
is initialised when the dataset is built, else (0, 1). Which samples each rank and worker
reads, and in what order, is in :mod:`.assignment` (exactly once per epoch over all ranks;
the same length on every rank, by padding or dropping fewer than ``world_size`` samples).

Each sample is ``{"__key__", ext: bytes, ..., "__shard__", "__pad__", "__worker__",
"__num_workers__", "__index__"}``; the last three say where it sits in its worker's stream and
are what :meth:`ShardedDataset.record` reads.

**Resume.** ``state_dict()`` holds the epoch and, per DataLoader worker, how many samples of
its stream were recorded as consumed. After ``load_state_dict()`` the next iteration of that
epoch yields exactly the samples not yet consumed, in the order the uninterrupted run would
have used (the shuffle buffer is replayed on positions, without reading data; reading resumes
at the first shard holding an unconsumed sample). A worker whose whole share was consumed
yields nothing while another worker still has samples left; only an epoch consumed by every
worker starts over when iterated again. Resuming needs the same seed, world size,
rank, shuffle settings and number of DataLoader workers; anything else is an error saying
which. Use ``persistent_workers=False`` (the default) so each epoch's workers see
``set_epoch`` and the loaded state.

Just over 500 lines: one class and its validated config; the plan (assignment.py), the streaming
and its retries (stream.py) live beside it.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Generator, Iterator
from typing import Any, Literal, get_args

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .assignment import UNEVEN_POLICIES, Segment, ShuffleSchedule, Uneven, plan_worker, rank_length
from .cache import ShardCache
from .errors import ManifestMismatchError
from .manifest import Manifest
from .metrics import Metrics, ProgressDisplay
from .s3 import S3Config
from .sources import LocalSource, open_source, require_finite_fields
from .stream import RetryConfig, ShardFetch, call_with_retries
from .tario import iter_samples

__all__ = ["DatasetConfig", "ShardedDataset"]

STATE_FORMAT = "ml-harness-data-state/1"


CacheVerify = Literal["crc32", "sha256", "size"]
"""How a cached shard is checked before use (``DatasetConfig.cache_verify``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetConfig:
    """Everything about reading a sharded dataset; validated once, here."""

    seed: int = 0
    """Seeds the per-epoch shard order and the sample shuffle; the same on every rank."""
    shuffle_shards: bool = True
    """Reshuffle the shard order each epoch (from ``seed`` and the epoch)."""
    shuffle_buffer: int = 1000
    """Samples held by each worker's shuffle buffer; 0 or 1: stored order. Memory is about
    ``shuffle_buffer`` samples per worker; the first sample waits for the buffer to fill."""
    uneven: Uneven = "pad"
    """Equal per-rank lengths: ``pad`` repeats (and flags) < world_size samples, ``drop``
    leaves < world_size out (see :mod:`.assignment`)."""
    rank: int | None = None
    world_size: int | None = None
    prefetch_depth: int = 2
    """Shards fetched ahead of the one being parsed, each by its own thread. 0: no read-ahead
    beyond the current shard's own background download."""
    chunk_bytes: int = 1 << 20
    """Read size of one network/file read (1 MiB: per-read overhead < 1% at 1 GB/s)."""
    buffer_bytes: int = 16 << 20
    """Bytes a fetch thread may hold ahead of its consumer (per shard in flight): memory is
    about ``(prefetch_depth + 1) * buffer_bytes`` per worker."""
    verify_downloads: bool = False
    """Also check the sha256 of every shard streamed without the cache. Off by default: a
    streamed shard is always checked for its size (before parsing) and sample count (at its
    end), TCP checksums its bytes, and hashing costs ~0.5 ms of CPU per MB (~1.9 GB/s), which
    on a 2-core machine also serving S3 took ~40% of the stream's throughput. A shard entering
    the cache is always checked against its sha256, whatever this says."""
    cache_dir: str | None = None
    """Local directory for the shard cache; None: no cache."""
    cache_max_bytes: int | None = None
    """Size limit of the cache (required with ``cache_dir``)."""
    cache_verify: CacheVerify = "crc32"
    """How a cached file is checked before use: ``crc32`` (recorded when it was cached after a
    sha256 check), ``sha256`` (full hash every time) or ``size`` only."""
    retry: RetryConfig = dataclasses.field(default_factory=RetryConfig)
    s3: S3Config | None = None
    """Endpoint, credentials and timeouts for ``s3://`` sources."""
    progress: bool = False
    """Print a progress line (per worker) to stderr."""
    progress_interval_s: float = 5.0

    def __post_init__(self) -> None:
        require_finite_fields(self)
        if self.shuffle_buffer < 0:
            raise ValueError(f"shuffle_buffer must be >= 0, got {self.shuffle_buffer}")
        if self.uneven not in UNEVEN_POLICIES:
            raise ValueError(f"uneven must be one of {UNEVEN_POLICIES}, got {self.uneven!r}")
        if (self.rank is None) != (self.world_size is None):
            raise ValueError(
                f"give rank and world_size together or neither, got rank={self.rank} "
                f"world_size={self.world_size}"
            )
        if self.world_size is not None and not 0 <= self.rank < self.world_size:  # type: ignore[operator]
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if self.prefetch_depth < 0:
            raise ValueError(f"prefetch_depth must be >= 0, got {self.prefetch_depth}")
        if self.chunk_bytes < 4096:
            raise ValueError(f"chunk_bytes must be >= 4096, got {self.chunk_bytes}")
        if self.buffer_bytes < self.chunk_bytes:
            raise ValueError(
                f"buffer_bytes ({self.buffer_bytes}) must be >= chunk_bytes ({self.chunk_bytes})"
            )
        if (self.cache_dir is None) != (self.cache_max_bytes is None):
            raise ValueError(
                "give cache_dir and cache_max_bytes together (a cache needs a size limit), got "
                f"cache_dir={self.cache_dir!r} cache_max_bytes={self.cache_max_bytes!r}"
            )
        if self.cache_max_bytes is not None and self.cache_max_bytes <= 0:
            raise ValueError(f"cache_max_bytes must be > 0, got {self.cache_max_bytes}")
        if self.cache_verify not in get_args(CacheVerify):
            raise ValueError(
                f"cache_verify must be 'crc32', 'sha256' or 'size', got {self.cache_verify!r}"
            )
        if self.progress_interval_s <= 0:
            raise ValueError(f"progress_interval_s must be > 0, got {self.progress_interval_s}")


def _ints(value: Any) -> list[int]:
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


class ShardedDataset(IterableDataset):
    """Streams the shards of ``source`` (``s3://bucket/prefix`` or a local directory)."""

    def __init__(
        self, source: Any, config: DatasetConfig | None = None, *, manifest: Manifest | None = None
    ) -> None:
        super().__init__()
        self.config = config or DatasetConfig()
        self.source = open_source(source, self.config.s3)
        if manifest is None:
            manifest = call_with_retries(
                self.source.read_manifest,
                source=self.source,
                retry=self.config.retry,
                what=f"reading the manifest of {self.source.url}",
            )
        self.manifest = manifest
        self.rank: int
        self.world_size: int
        if self.config.world_size is not None:
            assert self.config.rank is not None  # DatasetConfig gives both or neither
            self.rank, self.world_size = self.config.rank, self.config.world_size
        elif torch.distributed.is_available() and torch.distributed.is_initialized():
            self.rank, self.world_size = (
                torch.distributed.get_rank(),
                torch.distributed.get_world_size(),
            )
        else:
            self.rank, self.world_size = 0, 1
        self._counts = [s.num_samples for s in self.manifest.shards]
        # Validates world size against the data (e.g. 'drop' with fewer samples than ranks).
        plan_worker(
            self._counts,
            seed=self.config.seed,
            epoch=0,
            rank=self.rank,
            world_size=self.world_size,
            uneven=self.config.uneven,
        )
        self.epoch = 0
        self._consumed: dict[int, int] = {}
        self._num_workers: int | None = None
        self.metrics = Metrics()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["metrics"] = None  # a lock; each process counts its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.metrics = Metrics()

    def __len__(self) -> int:
        """Samples this rank yields per epoch: the same on every rank."""
        return rank_length(sum(self._counts), self.world_size, self.config.uneven)

    # ----------------------------------------------------------------------- epochs and resume
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (its shard order and shuffle); a new epoch starts unconsumed."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self._consumed = {}
            self._num_workers = None  # a new epoch may use another number of workers
        self.epoch = epoch

    def record(self, batch: dict[str, Any]) -> None:
        """Mark a sample or a collated batch as consumed (call after using it)."""
        try:
            index, worker, workers = (
                batch["__index__"],
                batch["__worker__"],
                batch["__num_workers__"],
            )
        except KeyError as exc:
            raise ValueError(
                f"record() needs the {exc.args[0]!r} entry this dataset adds to every sample; "
                "keep it in the batch (a custom collate_fn must pass it through)"
            ) from None
        for i, w, k in zip(_ints(index), _ints(worker), _ints(workers), strict=True):
            if self._num_workers not in (None, k):
                raise ValueError(
                    f"record(): batch from a run with {k} DataLoader workers, but earlier ones "
                    f"had {self._num_workers}"
                )
            self._num_workers = k
            if i + 1 > self._consumed.get(w, 0):
                self._consumed[w] = i + 1

    def state_dict(self) -> dict[str, Any]:
        """Where this rank is in its epoch (plain ints and strings: JSON- and torch.save-able)."""
        workers = self._num_workers
        return {
            "format": STATE_FORMAT,
            "manifest_sha256": self.manifest.digest,
            "seed": self.config.seed,
            "shuffle_shards": self.config.shuffle_shards,
            "shuffle_buffer": self.config.shuffle_buffer,
            "uneven": self.config.uneven,
            "rank": self.rank,
            "world_size": self.world_size,
            "epoch": self.epoch,
            "num_workers": workers,
            "consumed": [self._consumed.get(w, 0) for w in range(workers or 0)],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"not a ShardedDataset state (format {state.get('format')!r}, "
                f"expected {STATE_FORMAT!r})"
            )
        if state["manifest_sha256"] != self.manifest.digest:
            raise ValueError(
                "the state is for a different dataset: its manifest sha256 is "
                f"{state['manifest_sha256'][:16]}..., this one's {self.manifest.digest[:16]}..."
            )
        mine = {
            "seed": self.config.seed,
            "shuffle_shards": self.config.shuffle_shards,
            "shuffle_buffer": self.config.shuffle_buffer,
            "uneven": self.config.uneven,
            "rank": self.rank,
            "world_size": self.world_size,
        }
        for key, value in mine.items():
            if state[key] != value:
                raise ValueError(
                    f"cannot resume: the state was saved with {key}={state[key]!r}, this dataset "
                    f"has {key}={value!r}; resume with the same {key}"
                )
        self.epoch = int(state["epoch"])
        self._num_workers = state["num_workers"]
        self._consumed = {w: int(n) for w, n in enumerate(state["consumed"])}

    # ----------------------------------------------------------------------- iteration
    def plan(self, worker: int = 0, num_workers: int = 1) -> list[Segment]:
        """The segments one of this rank's workers reads in the current epoch."""
        return plan_worker(
            self._counts,
            seed=self.config.seed,
            epoch=self.epoch,
            rank=self.rank,
            world_size=self.world_size,
            worker=worker,
            num_workers=num_workers,
            uneven=self.config.uneven,
            shuffle_shards=self.config.shuffle_shards,
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        consumed = 0
        if self._consumed:
            if self._num_workers != workers:
                raise ValueError(
                    f"cannot resume: the state was recorded with {self._num_workers} DataLoader "
                    f"worker(s), this loader has {workers}; resume with num_workers="
                    f"{self._num_workers or 0}"
                )
            consumed = self._consumed.get(worker, 0)
        segments = self.plan(worker, workers)
        length = sum(len(s) for s in segments)
        # Whether the epoch is over is a question about every worker's share, not this one's:
        # a worker that delivered its whole share before the state was saved must yield
        # nothing on resume while the others finish theirs (replaying its share would
        # duplicate it). Only an epoch every worker finished starts over (same order).
        if consumed and self._epoch_consumed(workers):
            consumed = 0
        return self._iterate(segments, length, min(consumed, length), worker, workers)

    def _epoch_consumed(self, workers: int) -> bool:
        """Whether every one of ``workers`` workers has consumed its whole share."""
        for w in range(workers):
            share = sum(len(s) for s in self.plan(w, workers))
            if self._consumed.get(w, 0) < share:
                return False
        return True

    def _iterate(
        self, segments: list[Segment], length: int, consumed: int, worker: int, workers: int
    ) -> Iterator[dict[str, Any]]:
        cfg = self.config
        schedule = ShuffleSchedule(
            length,
            cfg.shuffle_buffer,
            key=f"{cfg.seed}/{self.epoch}/{self.rank}/{self.world_size}/{worker}/{workers}",
        )
        schedule.advance(consumed)
        buffered, next_input = schedule.pending()
        first = min(buffered, default=next_input)
        # Positions read again on the way to the buffer's contents but consumed already.
        done_before = set(range(first, next_input)).difference(buffered)
        progress = None
        if cfg.progress:
            progress = ProgressDisplay(
                length,
                interval_s=cfg.progress_interval_s,
                label=f"data epoch {self.epoch} rank {self.rank}/{self.world_size} "
                f"worker {worker}/{workers}",
            )
        have: dict[int, dict[str, Any]] = {}
        inputs = self._read(segments, first, worker, workers)
        metrics = self.metrics
        if metrics.samples == 0:
            metrics.started = time.monotonic()  # rates from the first iteration's start
        try:
            if cfg.shuffle_buffer <= 1:  # stored order: input positions are output indices
                for pos, sample in inputs:
                    sample["__index__"] = pos
                    metrics.samples += 1  # only this thread writes it
                    if progress is not None:
                        progress.update(metrics, pos + 1)
                    yield sample
                schedule.emitted = length
                return
            for out_index, position in enumerate(schedule, start=consumed):
                while position not in have:
                    item = next(inputs, None)
                    if item is None:
                        raise ManifestMismatchError(
                            f"worker {worker}: the shards ended before sample position "
                            f"{position} of {length}; the manifest's sample counts are wrong"
                        )
                    pos, sample = item
                    if pos in done_before:
                        done_before.discard(pos)
                        continue
                    have[pos] = sample
                sample = have.pop(position)
                sample["__index__"] = out_index
                metrics.samples += 1  # only this thread writes it
                if progress is not None:
                    progress.update(metrics, out_index + 1)
                yield sample
            # Let the reader finish: end-of-shard checks, downloads completing into the cache.
            # Positions consumed before a resume may still come by; nothing else may.
            for pos, _ in inputs:
                if pos in done_before:
                    continue
                raise ManifestMismatchError(
                    f"worker {worker}: the shards hold more samples than planned (position {pos}"
                    f" of {length}); the manifest's sample counts are wrong"
                )
        finally:
            inputs.close()
            if progress is not None:
                progress.close(metrics, schedule.emitted)

    def _make_cache(self) -> ShardCache | None:
        cfg = self.config
        if cfg.cache_dir is None:
            return None
        protected = [self.source.root] if isinstance(self.source, LocalSource) else []
        return ShardCache(
            cfg.cache_dir,
            cfg.cache_max_bytes or 0,
            verify=cfg.cache_verify,
            protected=protected,
            metrics=self.metrics,
        )

    def _read(
        self, segments: list[Segment], first: int, worker: int, workers: int
    ) -> Generator[tuple[int, dict[str, Any]], None, None]:
        """(position, sample) for every position >= ``first`` of this worker's input stream,
        with up to ``prefetch_depth`` shards being fetched ahead of the one being parsed."""
        cfg = self.config
        cache = self._make_cache()
        todo: list[tuple[int, Segment, int]] = []  # (first position, segment, samples to skip)
        pos = 0
        for seg in segments:
            if pos + len(seg) > first:
                skip = max(0, first - pos)
                todo.append((pos + skip, seg, skip))
            pos += len(seg)
        ahead: deque[ShardFetch] = deque()
        released: list[ShardFetch] = []
        launched = 0
        ok = False

        def launch(up_to: int) -> None:
            nonlocal launched
            while launched < len(todo) and len(ahead) < up_to:
                shard = self.manifest.shards[todo[launched][1].shard]
                ahead.append(
                    ShardFetch(
                        self.source,
                        shard,
                        cache=cache,
                        retry=cfg.retry,
                        chunk_bytes=cfg.chunk_bytes,
                        buffer_bytes=cfg.buffer_bytes,
                        verify=cfg.verify_downloads,
                        metrics=self.metrics,
                    ).start()
                )
                launched += 1

        try:
            for start, seg, skip in todo:
                launch(1)
                fetch = ahead.popleft()
                # Read-ahead starts once this shard's first sample was taken: requests for the
                # next shards would otherwise compete with this one's first bytes (thread
                # starts, and boto3 preparing requests in Python under the GIL) and delay the
                # first sample of an epoch by 5-10 ms per prefetched shard.
                fill = True
                released.append(fetch)  # from here on it is ours to finish or abort
                shard = self.manifest.shards[seg.shard]
                where = self.source.location(shard.name)
                to_end = seg.stop == shard.num_samples
                counts = [-1]
                position = start
                name, pad = shard.name, seg.pad
                try:
                    hit = fetch.indexed()  # waits for the shard's first bytes
                    if hit is not None and hit.index is not None:  # indexed() hands only those
                        # A verified cache hit with its sample index: each member is one pread
                        # at its offset (small ones come with the index), no header parsing:
                        # the samples iter_samples would build. pread releases the GIL, so the
                        # fetch threads keep checking the next shards meanwhile.
                        counts[0] = len(hit.index)
                        samples: Any = hit.index.samples(
                            hit.fd,
                            seg.start + skip,
                            seg.stop,
                            f"cached copy {hit.path} of shard {where}",
                        )
                    else:
                        samples = iter_samples(
                            fetch.chunks(),
                            where,
                            skip=seg.start + skip,
                            stop=seg.stop,
                            drain=to_end,
                            counts=counts,
                        )
                    try:
                        for sample in samples:
                            sample["__shard__"] = name
                            sample["__pad__"] = pad
                            sample["__worker__"] = worker
                            sample["__num_workers__"] = workers
                            yield position, sample
                            position += 1
                            if fill:
                                launch(cfg.prefetch_depth)
                                fill = False
                    finally:
                        samples.close()
                finally:
                    fetch.release()
                if position != start + len(seg) - skip or (
                    to_end and counts[0] != shard.num_samples
                ):
                    raise ManifestMismatchError(
                        f"shard {where} holds {counts[0] if counts[0] >= 0 else 'fewer'} samples, "
                        f"the manifest says {shard.num_samples}; rebuild the manifest "
                        "(build_manifest) or re-upload the shard"
                    )
                self._raise_background(released)
            for fetch in released:  # downloads finishing into the cache
                fetch.join()
            self._raise_background(released)
            ok = True
        finally:
            if not ok:  # closed early or failed: stop every download, drop partial cache files
                stopping = (*ahead, *released)
                for fetch in stopping:
                    fetch.abort()
                for fetch in stopping:  # they notice within a chunk; bounded for a stuck socket
                    fetch.join(5.0)

    @staticmethod
    def _raise_background(released: list[ShardFetch]) -> None:
        """A shard read only in part was still downloaded for the cache; a mismatch found
        then is still the manifest's fault and must not pass silently."""
        for fetch in list(released):
            if fetch.join(0):
                released.remove(fetch)
                if isinstance(fetch.error, ManifestMismatchError):
                    raise fetch.error
