"""One shard's bytes, fetched by a background thread: cache, ranged GETs with resume, retries.

A :class:`ShardFetch` starts a thread that produces the shard's bytes as chunks into a
bounded queue; the consumer parses them as they arrive (samples are yielded while the shard
is still downloading). The thread:

1. looks the shard up in the local cache (which checks the cached file before handing it
   over); a verified hit is handed over with its sample index, and the consumer reads each
   member at its offset instead of parsing (:meth:`ShardFetch.indexed`); a hit that could not
   be indexed is handed over as one memory map, to be parsed;
2. otherwise streams it with ``GET Range: bytes=OFFSET-``; when a read fails (connection cut,
   reset, timeout, a 5xx while the server restarts) it backs off and resumes from the last
   byte it received, giving up with :class:`ShardReadError` after ``max_attempts`` consecutive
   attempts that brought no new byte (botocore never retries a failure in the middle of a
   body, docs/platform.md: this is the only place that resumes one);
3. hashes what it receives, and when a cache is configured writes it to a part file that is
   renamed into the cache only if the whole object matched the manifest's sha256.

Back-pressure: the queue holds at most ``buffer_bytes``; a thread ahead of its consumer
waits. Stopping: :meth:`release` says the consumer needs no more bytes (a download that feeds
the cache finishes in the background); :meth:`abort` stops everything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import queue
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .cache import CachedShard, CacheWriter, ShardCache
from .errors import DataError, ManifestMismatchError, ShardReadError, StorageUnavailableError
from .manifest import ShardInfo
from .metrics import Metrics
from .sources import LocalSource, Source, is_transient, require_finite_fields

__all__ = ["RetryConfig", "ShardFetch", "call_with_retries"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryConfig:
    """Bounded retries with exponential backoff for one shard's reads."""

    max_attempts: int = 12
    """Consecutive attempts without receiving a new byte before giving up. Progress resets the
    count: a flaky link that keeps delivering is not cut off, a dead one is. The defaults'
    backoff sum (10-13 s) outlasts a SeaweedFS restart (1-5 s of refusals, then 500s)."""
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 2.0
    jitter: float = 0.25
    """Each delay is scaled by a factor in [1 - jitter, 1] (seeded per shard), so workers that
    failed together do not retry in lock step."""

    def __post_init__(self) -> None:
        require_finite_fields(self)
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ValueError(
                "need 0 < backoff_initial_s <= backoff_max_s, got "
                f"{self.backoff_initial_s} and {self.backoff_max_s}"
            )
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")

    def delay(self, failures: int, rng: random.Random) -> float:
        base = min(self.backoff_max_s, self.backoff_initial_s * 2 ** (failures - 1))
        return base * (1 - self.jitter * rng.random())


def _endpoint(source: Source) -> str:
    endpoint = getattr(source, "endpoint", None)
    return f"endpoint {endpoint}" if endpoint else source.url


def call_with_retries(call: Callable[[], T], *, source: Source, retry: RetryConfig, what: str) -> T:
    """``call()``, retried with backoff while it fails transiently (:func:`.is_transient`).

    For requests that are not a shard's bytes (the manifest): after ``retry.max_attempts``
    failed attempts, :class:`StorageUnavailableError` names what was asked, the endpoint and
    the last error instead of letting a raw botocore error escape. Errors that retrying cannot
    cure (404, 403: :class:`.DataError`) and every error of a local source pass through.
    """
    if isinstance(source, LocalSource):
        return call()
    rng = random.Random(what)
    started = time.monotonic()
    for attempt in range(1, retry.max_attempts + 1):
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if attempt == retry.max_attempts:
                raise StorageUnavailableError(
                    f"{what}: no answer from {_endpoint(source)} after {attempt} attempt(s) over "
                    f"{time.monotonic() - started:.1f} s (last error: {type(exc).__name__}: "
                    f"{exc}); check that the server is up and that S3Config.endpoint_url is "
                    f"right, or raise RetryConfig.max_attempts (now {retry.max_attempts})"
                ) from exc
            time.sleep(retry.delay(attempt, rng))
    raise AssertionError("unreachable: max_attempts >= 1")


class _Mapped:
    """A local shard file mapped read-only; closed by the fetch once its consumer is done."""

    def __init__(self, mm: Any) -> None:
        self._mm = mm
        self.view = memoryview(mm)

    def close(self) -> None:
        self.view.release()
        # A derived view still alive: the map goes with its last reference.
        with contextlib.suppress(BufferError):
            self._mm.close()


class _Truncated(Exception):
    """The body ended before the object's last byte (a FIN mid-body): resume like a reset."""


_DONE = object()
_NONE = object()


class ShardFetch:
    """The bytes of one shard, produced in a background thread (see the module docstring)."""

    def __init__(
        self,
        source: Source,
        shard: ShardInfo,
        *,
        cache: ShardCache | None,
        retry: RetryConfig,
        chunk_bytes: int,
        buffer_bytes: int,
        verify: bool,
        metrics: Metrics,
    ) -> None:
        self.source = source
        self.shard = shard
        self._cache = cache
        self._retry = retry
        self._chunk = chunk_bytes
        self._verify = verify
        self._metrics = metrics
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, buffer_bytes // chunk_bytes))
        self._released = threading.Event()
        self._aborted = threading.Event()
        self._hit: _Mapped | None = None  # a local file's map the consumer reads from
        self._hit_lock = threading.Lock()
        self.error: BaseException | None = None
        self.from_cache = False
        self._first: Any = _NONE  # an item indexed() took from the queue for chunks()
        self._thread = threading.Thread(target=self._run, name=f"fetch {shard.name}", daemon=True)

    def start(self) -> ShardFetch:
        self._thread.start()
        return self

    # ----------------------------------------------------------------------- consumer side
    def _get(self) -> Any:
        item = self._first
        if item is not _NONE:
            self._first = _NONE
            return item
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            t0 = time.perf_counter()
            item = self._queue.get()
            self._metrics.add(time_blocked_s=time.perf_counter() - t0)
            return item

    def indexed(self) -> CachedShard | None:
        """Waits for the shard's first bytes. A verified cache hit with a sample index is
        returned (read its samples from ``.fd`` at the offsets in ``.index`` until
        :meth:`release`); otherwise None, and :meth:`chunks` yields the bytes. Raises what
        the thread raised."""
        item = self._get()
        if isinstance(item, CachedShard):
            return item
        if isinstance(item, BaseException):
            raise item
        self._first = item
        return None

    def chunks(self) -> Iterator[Any]:
        """Chunks in order; raises what the fetch thread raised."""
        while True:
            item = self._get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def release(self) -> None:
        """The consumer is done (its parser closed); a download feeding the cache completes in
        the background. A local file's map is closed here; a cache hit's pin (and map) is
        dropped by the fetch thread, which waits for this call."""
        self._released.set()
        self._drain()
        with self._hit_lock:
            hit, self._hit = self._hit, None
        if hit is not None:
            self._thread.join()  # it only queues two items, and stops queueing once released
            hit.close()

    def abort(self) -> None:
        self._aborted.set()
        self.release()

    def join(self, timeout_s: float | None = None) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _drain(self) -> None:
        self._first = _NONE
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass

    # ----------------------------------------------------------------------- thread side
    def _put(self, item: Any) -> bool:
        """Queue an item unless the consumer no longer wants it (checked every 100 ms)."""
        while not self._released.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        writer: CacheWriter | None = None
        try:
            if self._cache is not None:
                hit = self._cache.lookup(self.shard)
                if hit is not None:
                    self.from_cache = True
                    try:
                        self._metrics.add(bytes_cache=self.shard.size, shards=1)
                        if hit.index is not None:
                            self._put(hit)  # the consumer reads samples at indexed offsets
                        elif self._put(hit.view):
                            self._put(_DONE)
                        # Closed here once the consumer is done, not in its thread (unmapping
                        # a populated 64 MB map takes 0.5-2 ms).
                        self._released.wait()
                    finally:
                        hit.close()
                    return
                writer = self._cache.reserve(self.shard)
            if writer is None and isinstance(self.source, LocalSource):
                self._map_local()
                return
            self._stream(writer)
            writer = None  # committed or aborted by _stream
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self.error = exc
            self._put(exc)
        finally:
            if writer is not None:
                writer.abort()

    def _map_local(self) -> None:
        """A local file needs no chunked reads: hand the consumer a map of it (one chunk, no
        per-chunk thread hand-off) and hash it meanwhile when asked to verify."""
        shard = self.shard
        mapped = _Mapped(self.source.map_shard(shard.name))  # type: ignore[attr-defined]
        with self._hit_lock:
            if self._released.is_set():
                mapped.close()
                return
            self._hit = mapped
        if len(mapped.view) != shard.size:
            raise ManifestMismatchError(
                f"shard {self.source.location(shard.name)} has {len(mapped.view)} bytes but the "
                f"manifest says {shard.size}; rebuild the manifest (build_manifest) or replace "
                "the file"
            )
        self._metrics.add(bytes_network=shard.size)
        self._put(mapped.view)
        if self._verify:
            actual = hashlib.sha256(mapped.view).hexdigest()  # releases the GIL
            if actual != shard.sha256:
                raise ManifestMismatchError(
                    f"shard {self.source.location(shard.name)}: sha256 of the file is {actual}, "
                    f"the manifest says {shard.sha256}; rebuild the manifest or replace the file"
                )
        self._metrics.add(shards=1)
        self._put(_DONE)

    def _stream(self, writer: CacheWriter | None) -> None:
        shard, size, retry = self.shard, self.shard.size, self._retry
        digest = hashlib.sha256() if (self._verify or writer is not None) else None
        rng = random.Random(shard.sha256)
        offset = 0
        failures = 0
        wrong_size: int | None = None  # the size the previous response claimed, when wrong
        try:
            while offset < size:
                if self._aborted.is_set() or (writer is None and self._released.is_set()):
                    return
                reader = None
                try:
                    reader = self.source.open_range(shard.name, offset)
                    if reader.total_size != size:
                        # One response can lie: a connection cut inside its headers can end in
                        # the middle of "Content-Length: 37888" and still parse (as 37). Only
                        # a size two responses in a row agree on is taken as the object's.
                        if reader.total_size == wrong_size:
                            raise ManifestMismatchError(
                                f"shard {self.source.location(shard.name)} has "
                                f"{reader.total_size} bytes but the manifest says {size}; "
                                "rebuild the manifest (build_manifest) or re-upload the shard"
                            )
                        wrong_size = reader.total_size
                        raise _Truncated(
                            f"the response says the object has {reader.total_size} bytes, the "
                            f"manifest {size}: asking again"
                        )
                    wrong_size = None
                    while offset < size:
                        data = reader.read(min(self._chunk, size - offset))
                        if not data:
                            raise _Truncated(f"body ended at byte {offset} of {size}")
                        offset += len(data)
                        failures = 0
                        self._metrics.add(bytes_network=len(data))
                        if digest is not None:
                            digest.update(data)
                        if writer is not None:
                            writer.write(data)
                        if not self._released.is_set():
                            self._put(data)
                        elif writer is None or self._aborted.is_set():
                            return
                except DataError:
                    raise
                except Exception as exc:  # noqa: BLE001 - sorted by is_transient
                    if not (isinstance(exc, _Truncated) or is_transient(exc)):
                        raise
                    failures += 1
                    if failures >= retry.max_attempts:
                        raise ShardReadError(
                            f"shard {self.source.location(shard.name)} "
                            f"({_endpoint(self.source)}): gave up after "
                            f"{failures} consecutive attempts without progress at byte "
                            f"{offset} of {size} (last error: {type(exc).__name__}: {exc}); "
                            "check that the server is up, or raise RetryConfig.max_attempts "
                            f"(now {retry.max_attempts})"
                        ) from exc
                    self._metrics.add(retries=1)
                    if self._aborted.wait(retry.delay(failures, rng)):
                        return
                finally:
                    if reader is not None:
                        with contextlib.suppress(Exception):  # closing a broken connection
                            reader.close()
            if digest is not None and digest.hexdigest() != shard.sha256:
                raise ManifestMismatchError(
                    f"shard {self.source.location(shard.name)}: sha256 of the object is "
                    f"{digest.hexdigest()}, the manifest says {shard.sha256}; the object changed "
                    "after the manifest was written: rebuild the manifest or re-upload the shard"
                )
            if writer is not None:
                writer.commit()
                writer = None
            self._metrics.add(shards=1)
            self._put(_DONE)
        finally:
            if writer is not None:
                writer.abort()
