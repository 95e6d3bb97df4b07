"""Content-addressed artifact stores: the same bytes are stored once, under their sha256.

Two backends with one interface:

``LocalArtifactStore(root)``   ``root/objects/ab/abcdef...`` on a local filesystem. A put
    reads the source once, in 4 MiB chunks, into a few reused buffers; each chunk is hashed
    on one thread and written to ``root/tmp/<random>.part`` on another from the same buffer
    (hashlib and the write release the GIL, so reading, hashing and writing overlap), so the
    bytes stored are exactly the bytes hashed. Writes use direct I/O where the filesystem
    allows it (``O_DIRECT``: the disk works while the CPU hashes, no page-cache copy, and the
    final fsync has little left to do); elsewhere ordinary writes. A file that changes
    meanwhile (size or mtime) is refused. The temporary file is fsynced once and renamed into
    place, so an object either is complete under its name or is not there at all. If the
    object already exists the temporary file is dropped (deduplication). Speed against a
    plain copy: docs/benchmarks/tracking.md.
``S3ArtifactStore(bucket, ...)``  ``s3://bucket/prefix/objects/ab/abcdef...`` through boto3.
    The object's key is its hash, so the source is read once before the upload: the pass
    computes the sha256 of the whole and the sha256 of every part (the parts' on a thread of
    their own, part 0's copied from the running whole-file hash), so with a core free the
    pass takes about as long as one sha256 of the whole.
    An existing object is not uploaded again. A new one is sent with the TransferConfig's part
    size, threshold and concurrency (a single PUT below ``multipart_threshold``, else a
    multipart upload, visible only once complete), every part with its sha256 from that pass
    as its ``x-amz-checksum-sha256``: the server checks each part against it, so the stored
    bytes are the hashed bytes even if the file is edited in between (then BadDigest: the
    upload is aborted, ArtifactError). The same digest is what SigV4 would otherwise hash the
    body again for: the signed checksum header binds the body to the signature instead
    (``UNSIGNED-PAYLOAD``, as botocore does over https; see :func:`_prehashed_payload`), and
    boto3 computes no CRC32 of its own. So against a plain ``upload_file`` (which hashes every
    part for its signature and takes a CRC32 of it) the extra work is one sha256 minus a CRC32
    (docs/benchmarks/tracking.md). A server-side copy from a staging key (to overlap the hash
    with the upload) was measured and dropped: SeaweedFS copies the data, which costs several
    times the hash.

Downloads are verified: bytes are hashed while they are written to ``dest.part`` and renamed
to ``dest`` only if their sha256 and size match the reference; otherwise ArtifactError.

Orphans (objects no reference names) and partial uploads (``tmp/*.part`` files, incomplete
multipart uploads) are listed by :meth:`list_objects` / :meth:`cleanup_partials` and removed
by collection (retention.py), which decides what is referenced.

Over 500 lines, one concern: bytes in and out of a content-addressed store. The two backends
share one interface and one verification of downloads, and each put's read-once pass (the
local one hashes and writes from the same buffers; the S3 one hashes the whole and the parts)
lives next to the store that relies on it.
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import errno
import fcntl
import hashlib
import mmap
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import parse_qs, urlparse

from reference_impls.tracking.errors import ArtifactError

__all__ = [
    "ArtifactStore",
    "LocalArtifactStore",
    "ObjectInfo",
    "S3ArtifactStore",
    "open_artifact_store",
    "sha256_file",
]

CHUNK = 4 * 1024 * 1024  # bytes per read: large enough that per-call overhead vanishes
SLOTS = 4  # buffers in flight per put: reading runs ahead of hashing and writing
WRITERS = 2  # direct writes in flight: each waits for the disk, two keep it busier
DIRECT_ALIGN = 4096  # O_DIRECT wants buffer, offset and length aligned to the block size
O_DIRECT = getattr(os, "O_DIRECT", 0)  # Linux; elsewhere ordinary writes
SHA_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ObjectInfo:
    sha256: str
    size: int
    mtime: float


def sha256_file(
    path: str | os.PathLike[str], progress: Callable[[int], Any] | None = None
) -> tuple[str, int]:
    """(sha256 hex digest, size) of a file; ``progress(n)`` after every n bytes read."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
            if progress is not None:
                progress(n)
    return h.hexdigest(), size


def hash_parts(src: BinaryIO, part: int) -> tuple[str, int, list[bytes]]:
    """One read pass over ``src``: (sha256 hex digest, bytes, raw sha256 digest of every
    ``part``-byte part, the last one possibly shorter; one, of nothing, for an empty source).

    The first digest names the object; the parts' digests go with the upload's parts, so the
    server checks that each part holds the bytes this pass hashed (and botocore need not hash
    them again to sign the request: :func:`_prehashed_payload`). Part 0's digest costs
    nothing: it is a copy of the running whole-file hash taken at the end of part 0, so a
    single-part source is hashed once. The whole-file hash and the hash of parts 1.. each run
    on a thread of their own, in chunk order (hashlib releases the GIL), while the next chunk
    is read into another of SLOTS reused buffers: with a core free the pass takes about as
    long as one sha256 of the whole.
    """
    if part <= 0:
        raise ValueError(f"part size must be > 0, got {part}")
    h = hashlib.sha256()
    digests: list[bytes] = []
    first = [0]  # bytes of part 0 the whole-file hash has seen (runs on the one hash thread)
    rest: list[Any] = [None, 0]  # hash of the current part >= 1, bytes of it seen

    def whole(view: memoryview) -> None:  # the whole-file hash, in order, one thread
        if first[0] < part:
            take = min(len(view), part - first[0])
            h.update(view[:take])
            first[0] += take
            if first[0] == part:
                digests.insert(0, h.copy().digest())  # part 0 goes first whenever it ends
            view = view[take:]
        if view:
            h.update(view)

    def parts(view: memoryview, offset: int) -> None:  # parts 1.., in order, one thread
        pos = max(0, part - offset)  # part 0's bytes are the whole-file hash's business
        while pos < len(view):
            if rest[0] is None:
                rest[0], rest[1] = hashlib.sha256(), 0
            take = min(len(view) - pos, part - rest[1])
            rest[0].update(view[pos : pos + take])
            rest[1] += take
            pos += take
            if rest[1] == part:
                digests.append(rest[0].digest())
                rest[0] = None

    bufs = _take_buffers()  # reused between puts: fresh memory costs a page fault per 4 KiB
    pending: list[tuple[concurrent.futures.Future[None], ...]] = []
    size = 0
    with (
        concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="artifact-hash") as hasher,
        concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="artifact-parts") as parter,
    ):
        k = 0
        while True:
            if len(pending) == len(bufs):  # both are done with this buffer before reuse
                for f in pending.pop(0):
                    f.result()
            view = memoryview(bufs[k % len(bufs)])
            n = _read_full(src, view)
            if not n:
                break
            jobs: tuple[concurrent.futures.Future[None], ...] = (hasher.submit(whole, view[:n]),)
            if size + n > part:  # bytes past part 0 in this chunk
                jobs += (parter.submit(parts, view[:n], size),)
            pending.append(jobs)
            size += n
            k += 1
        for fs in pending:
            for f in fs:
                f.result()
    # Only here, with both threads finished with them (also on an error: the executors wait).
    _give_buffers(bufs)
    if first[0] < part:  # the source ended inside part 0 (or was empty)
        digests.insert(0, h.copy().digest())
    elif rest[0] is not None:  # a last, shorter part
        digests.append(rest[0].digest())
    return h.hexdigest(), size, digests


@contextlib.contextmanager
def _refused_part(key: str) -> Iterator[None]:
    """Say what a refused checksum means: the file is no longer the bytes that were hashed."""
    from botocore.exceptions import ClientError

    try:
        yield
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("BadDigest", "InvalidDigest"):
            raise
        raise ArtifactError(
            f"the file changed while it was being stored as {key}: the server found a part "
            "that no longer matches the bytes that were hashed; nothing was stored, log it again"
        ) from None


def _b64(digest: bytes) -> str:
    """A raw digest as S3 wants it in ``x-amz-checksum-sha256``: base64."""
    return base64.b64encode(digest).decode()


_PREHASHED = threading.local()  # .on: this thread is sending a part with its sha256 checksum


def _prehashed_payload(request: Any, **_: Any) -> None:
    """botocore ``before-sign`` hook for our PutObject/UploadPart requests: the body's sha256
    is already in the signed ``x-amz-checksum-sha256`` header, so SigV4 need not hash the
    body again for ``x-amz-content-sha256`` (``UNSIGNED-PAYLOAD``, which botocore itself
    uses over https whenever a checksum header is present).

    Why that loses nothing: the signature covers the checksum header, and the server refuses
    a body whose sha256 is not that header's (S3 does; SeaweedFS does, tested), so the body is
    bound to the signature by the same sha256 as a signed payload would bind it. Over plain
    http it is more than boto3 does by default against SeaweedFS, which does not check
    ``x-amz-content-sha256`` against the body at all and so only checks the CRC32
    (docs/benchmarks/tracking.md). Only requests this module sends from a thread that set
    ``_PREHASHED.on`` and that carry the header are touched; a client configured with
    ``payload_signing_enabled`` keeps its setting."""
    if not getattr(_PREHASHED, "on", False) or "x-amz-checksum-sha256" not in request.headers:
        return
    config = request.context.get("client_config")
    s3 = dict(getattr(config, "s3", None) or {})
    if config is None or s3.get("payload_signing_enabled") is not None:
        return
    s3["payload_signing_enabled"] = False
    request.context["client_config"] = config.merge(type(config)(s3=s3))


@contextlib.contextmanager
def _prehashed() -> Iterator[None]:
    _PREHASHED.on = True
    try:
        yield
    finally:
        _PREHASHED.on = False


def _read_part(fd: int, buf: bytearray, offset: int, key: str) -> bytearray:
    """Fill ``buf`` with the file's bytes from ``offset``: the body of one PUT or part.

    A bytearray, not bytes: botocore wraps a bytes body in a BytesIO that urllib3 then reads
    and sends in 128 KiB copies, while a bytearray goes to the socket in one ``sendall`` (a
    16 MiB part: 6-7 ms of CPU instead of 10-13; docs/benchmarks/tracking.md). The buffer is
    reused for later parts, so a part costs no fresh memory (and no page faults) either."""
    view = memoryview(buf)
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            raise ArtifactError(
                f"the file changed while it was being stored as {key}: it is shorter than "
                "when it was hashed; nothing was stored, log it again"
            )
        got += n
    return buf


def check_sha(sha256: str) -> str:
    if not isinstance(sha256, str) or not SHA_RE.fullmatch(sha256):
        raise ArtifactError(f"{sha256!r} is not a sha256 (64 lowercase hex digits)")
    return sha256


class ArtifactStore(Protocol):
    """What the tracker needs from a store of bytes named by their sha256."""

    def put_file(
        self,
        path: str | os.PathLike[str],
        *,
        before_commit: Callable[[str], Any] | None = None,
        progress: Callable[[int], Any] | None = None,
    ) -> tuple[str, int, bool]:
        """Store a file; (sha256, size, True if the bytes were new)."""
        ...

    def get_to_file(self, sha256: str, dest: str | os.PathLike[str], size: int) -> None: ...
    def exists(self, sha256: str) -> bool: ...
    def uri(self, sha256: str) -> str: ...
    def delete(self, sha256: str) -> None: ...
    def list_objects(self) -> Iterator[ObjectInfo]: ...
    def cleanup_partials(self, older_than_s: float) -> int: ...


def _verify_stream(chunks: Iterator[bytes], dest: Path, sha256: str, size: int, where: str) -> None:
    """Write chunks to dest via dest.part, hashing; rename only when hash and size match."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}.part")
    h = hashlib.sha256()
    n = 0
    try:
        with open(part, "wb") as out:
            for chunk in chunks:
                h.update(chunk)
                out.write(chunk)
                n += len(chunk)
        got = h.hexdigest()
        if got != sha256 or n != size:
            raise ArtifactError(
                f"{where} is damaged: expected sha256 {sha256} ({size} bytes), got {got} "
                f"({n} bytes); the download was discarded"
            )
        os.replace(part, dest)
    finally:
        part.unlink(missing_ok=True)


def _copy_hashing(src: BinaryIO, fd: int, progress: Callable[[int], Any] | None) -> tuple[str, int]:
    """Copy ``src`` to the file open at ``fd`` (from offset 0) and hash it, in one read pass:
    (sha256 hex digest, bytes). See the module docstring.

    The main thread reads chunk k into buffer k % SLOTS and hands it to a hashing thread (one:
    chunks are hashed in order) and to WRITERS writing threads (each chunk written with
    pwrite at its offset); a buffer is read into again only once both are done with it, and
    ``progress(n)`` runs then, for bytes that are written. A direct write of the last, short
    chunk is padded to the block size and the file cut back to its length afterwards; a
    filesystem that refuses a direct write gets ordinary writes from then on.
    """
    h = hashlib.sha256()
    direct = bool(O_DIRECT) and bool(fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT)

    def write(view: memoryview, offset: int, n: int) -> None:
        nonlocal direct
        if direct:
            padded = -(-n // DIRECT_ALIGN) * DIRECT_ALIGN
            if padded != n:
                view[n:padded] = bytes(padded - n)  # beyond the data: cut off below
            try:
                _pwrite_all(fd, view[:padded], offset)
                return
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # The filesystem refused this direct write: ordinary writes from here on (two
                # writers may both get here; clearing the flag twice is harmless).
                fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~O_DIRECT)
                direct = False
        _pwrite_all(fd, view[:n], offset)

    bufs = _take_buffers()
    hasher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="artifact-hash")
    writer = concurrent.futures.ThreadPoolExecutor(WRITERS, thread_name_prefix="artifact-write")
    inflight: list[tuple[concurrent.futures.Future[Any], concurrent.futures.Future[Any], int]] = []
    size = 0
    view = memoryview(b"")
    try:
        k = 0
        while True:
            if len(inflight) == SLOTS:
                hashed, written, n = inflight.pop(0)
                hashed.result()
                written.result()
                if progress is not None:
                    progress(n)
            view = memoryview(bufs[k % SLOTS])
            n = _read_full(src, view)
            if not n:
                break
            inflight.append(
                (hasher.submit(h.update, view[:n]), writer.submit(write, view, size, n), n)
            )
            size += n
            k += 1
        for hashed, written, n in inflight:
            hashed.result()
            written.result()
            if progress is not None:
                progress(n)
        inflight.clear()
        if os.fstat(fd).st_size != size:  # a padded direct write went past the end
            os.ftruncate(fd, size)
    finally:
        # On an error, let the threads finish with the buffers before they are dropped (the
        # mappings are freed with their last reference).
        hasher.shutdown(wait=True)
        writer.shutdown(wait=True)
        del view
        _give_buffers(bufs)
    return h.hexdigest(), size


_FREE_BUFFERS: list[list[mmap.mmap]] = []  # sets of SLOTS buffers between puts
_FREE_LOCK = threading.Lock()
_MAX_FREE_SETS = 2


def _take_buffers() -> list[mmap.mmap]:
    """SLOTS reused buffers: a fresh mapping costs a page fault per 4 KiB on first touch.
    mmap'd buffers are page-aligned, as direct I/O needs; CHUNK is a multiple of the block."""
    with _FREE_LOCK:
        if _FREE_BUFFERS:
            return _FREE_BUFFERS.pop()
    return [mmap.mmap(-1, CHUNK) for _ in range(SLOTS)]


def _give_buffers(bufs: list[mmap.mmap]) -> None:
    with _FREE_LOCK:
        if len(_FREE_BUFFERS) < _MAX_FREE_SETS:
            _FREE_BUFFERS.append(bufs)


_PART_BUFFERS: list[bytearray] = []  # S3 part bodies between puts, all of one size
_PART_BUFFERS_KEPT = 64 * 1024 * 1024  # at most this many bytes of them


def _take_part_buffer(n: int) -> bytearray:
    """A buffer of ``n`` bytes for one S3 part's body: a kept one if there is one that size.

    Full parts' buffers are kept between puts, up to _PART_BUFFERS_KEPT bytes in the
    process (four 16 MiB parts, the default concurrency and part size): a fresh 16 MiB
    buffer costs 4,096 page faults (about 10 ms of CPU) the first time it is filled, and
    stores are often made per put (one per bucket or prefix)."""
    with _FREE_LOCK:
        if _PART_BUFFERS and len(_PART_BUFFERS[-1]) == n:
            return _PART_BUFFERS.pop()
    return bytearray(n)


def _give_part_buffer(buf: bytearray, part: int) -> None:
    """Keep a full part's buffer (not a last, shorter one); the newest size wins."""
    if len(buf) != part:
        return
    with _FREE_LOCK:
        if _PART_BUFFERS and len(_PART_BUFFERS[0]) != part:
            _PART_BUFFERS.clear()
        if (len(_PART_BUFFERS) + 1) * part <= _PART_BUFFERS_KEPT:
            _PART_BUFFERS.append(buf)


def _read_full(src: BinaryIO, view: memoryview) -> int:
    """Fill ``view`` from ``src`` (a stream may return less per call); less only at the end.
    Full chunks keep every write's offset aligned for direct I/O."""
    got = 0
    while got < len(view):
        n = src.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            break
        got += n
    return got


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _open_part(path: Path) -> int:
    """A new temporary file for writing, with direct I/O where the filesystem allows it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    if O_DIRECT:
        try:
            return os.open(path, flags | O_DIRECT, 0o644)
        except OSError as exc:
            if exc.errno != errno.EINVAL:  # EINVAL: this filesystem has no direct I/O
                raise
    return os.open(path, flags, 0o644)


def check_local_root(root: str | os.PathLike[str]) -> Path:
    """``root`` if a local store can live there (it or its nearest existing ancestor is a
    directory), else an ArtifactError naming the file in the way; nothing is created."""
    p = Path(root)
    if p.exists() and not p.is_dir():
        raise ArtifactError(f"artifact store {str(p)!r} is a file, not a directory")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ArtifactError(
                    f"artifact store {str(p)!r}: {str(parent)!r} is a file, not a directory"
                )
            break
    return p


class LocalArtifactStore:
    """Objects on a local filesystem (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        check_local_root(root)
        self.root = Path(root).resolve()
        self.objects = self.root / "objects"
        self.tmp = self.root / "tmp"
        self.objects.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync

    def path(self, sha256: str) -> Path:
        check_sha(sha256)
        return self.objects / sha256[:2] / sha256

    def uri(self, sha256: str) -> str:
        return self.path(sha256).as_uri()

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def put_file(
        self,
        path: str | os.PathLike[str],
        *,
        before_commit: Callable[[str], Any] | None = None,
        progress: Callable[[int], Any] | None = None,
    ) -> tuple[str, int, bool]:
        """Store a file; ``before_commit(sha256)`` runs once the hash is known and before the
        object becomes visible or is found to exist (the tracker records its upload intent);
        ``progress(n)`` after every n bytes written."""
        with open(path, "rb", buffering=0) as src:
            before = os.fstat(src.fileno())
            return self._put(
                src, before_commit, progress, lambda size: self._unchanged(path, before, size)
            )

    def put_stream(
        self,
        src: BinaryIO,
        *,
        before_commit: Callable[[str], Any] | None = None,
        progress: Callable[[int], Any] | None = None,
    ) -> tuple[str, int, bool]:
        """Store what ``src`` reads until its end (see :meth:`put_file`)."""
        return self._put(src, before_commit, progress, None)

    @staticmethod
    def _unchanged(path: str | os.PathLike[str], before: os.stat_result, size: int) -> None:
        after = os.stat(path)
        if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns) or (
            size != before.st_size
        ):
            raise ArtifactError(f"{path} changed while it was being stored; log it again")

    def _put(
        self,
        src: BinaryIO,
        before_commit: Callable[[str], Any] | None,
        progress: Callable[[int], Any] | None,
        check: Callable[[int], None] | None,
    ) -> tuple[str, int, bool]:
        part = self.tmp / f"{uuid.uuid4().hex}.part"
        try:
            fd = _open_part(part)
            try:
                digest, size = _copy_hashing(src, fd, progress)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if check is not None:
                check(size)
            return self._commit(part, digest, size, before_commit)
        finally:
            part.unlink(missing_ok=True)

    def _commit(
        self, part: Path, sha: str, size: int, before_commit: Callable[[str], Any] | None
    ) -> tuple[str, int, bool]:
        """Publish a complete, synced temporary file under its hash (or drop it: a
        duplicate)."""
        if before_commit is not None:
            before_commit(sha)
        final = self.path(sha)
        if final.exists():
            # Fresh mtime: collection spares objects younger than its grace period, so bytes
            # about to be referenced again are not collected in between.
            os.utime(final)
            return sha, size, False
        final.parent.mkdir(exist_ok=True)
        os.replace(part, final)
        if self.fsync:
            fd = os.open(final.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return sha, size, True

    def get_to_file(self, sha256: str, dest: str | os.PathLike[str], size: int) -> None:
        src = self.path(sha256)

        def chunks() -> Iterator[bytes]:
            try:
                f = open(src, "rb", buffering=0)  # noqa: SIM115 - closed by the with below
            except FileNotFoundError:
                raise ArtifactError(
                    f"artifact bytes {sha256} are missing from {self.root}; the reference "
                    "points at bytes that were deleted outside the tracker"
                ) from None
            with f:
                while chunk := f.read(CHUNK):
                    yield chunk

        _verify_stream(chunks(), Path(dest), sha256, size, f"object {sha256} in {self.root}")

    def delete(self, sha256: str) -> None:
        self.path(sha256).unlink(missing_ok=True)

    def list_objects(self) -> Iterator[ObjectInfo]:
        for sub in sorted(self.objects.iterdir()):
            if not sub.is_dir():
                continue
            for f in sorted(sub.iterdir()):
                if SHA_RE.fullmatch(f.name):
                    st = f.stat()
                    yield ObjectInfo(f.name, st.st_size, st.st_mtime)

    def cleanup_partials(self, older_than_s: float) -> int:
        n = 0
        cutoff = time.time() - older_than_s
        for f in self.tmp.glob("*.part"):
            try:
                if f.stat().st_mtime <= cutoff:
                    f.unlink()
                    n += 1
            except FileNotFoundError:
                pass
        return n


class S3ArtifactStore:
    """Objects in an S3 bucket (see the module docstring); ``client`` is a boto3 S3 client."""

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        client: Any = None,
        endpoint_url: str | None = None,
        multipart_threshold: int = 16 * 1024 * 1024,
        multipart_chunksize: int = 16 * 1024 * 1024,
        max_concurrency: int = 4,
    ) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig

        if not re.fullmatch(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]", bucket):
            raise ArtifactError(f"invalid S3 bucket name {bucket!r}: 3-63 of [a-z0-9.-]")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        if client is None:
            from botocore.config import Config

            client = boto3.client(
                "s3",
                endpoint_url=endpoint_url,
                region_name=os.environ.get("AWS_REGION", "us-east-1"),
                # Path-style addressing: S3-compatible servers on an address, not a domain.
                config=Config(s3={"addressing_style": "path"}) if endpoint_url else None,
            )
        self.client = client
        for op in ("PutObject", "UploadPart"):
            client.meta.events.register(
                f"before-sign.s3.{op}", _prehashed_payload, unique_id=f"ml-harness-prehashed-{op}"
            )
        self.transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_concurrency=max_concurrency,
        )

    def key(self, sha256: str) -> str:
        check_sha(sha256)
        return f"{self.prefix}objects/{sha256[:2]}/{sha256}"

    def uri(self, sha256: str) -> str:
        return f"s3://{self.bucket}/{self.key(sha256)}"

    def exists(self, sha256: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self.key(sha256))
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def put_file(
        self,
        path: str | os.PathLike[str],
        *,
        before_commit: Callable[[str], Any] | None = None,
        progress: Callable[[int], Any] | None = None,
    ) -> tuple[str, int, bool]:
        """Hash (the whole and every part), then upload unless the object exists, each part
        carrying the sha256 of the bytes that were hashed (see the module docstring and
        LocalArtifactStore.put_file); ``progress(n)`` after every n bytes uploaded."""
        from s3transfer.utils import ChunksizeAdjuster  # type: ignore[import-untyped]

        with open(path, "rb", buffering=0) as src:
            before = os.fstat(src.fileno())
            size = before.st_size
            single = size < self.transfer.multipart_threshold
            # As boto3's managed transfer does: parts of at least 5 MiB, at most 10,000 of them.
            part = (
                max(size, 1)
                if single
                else ChunksizeAdjuster().adjust_chunksize(self.transfer.multipart_chunksize, size)
            )
            sha, got, digests = hash_parts(src, part)
            if got != size:
                raise ArtifactError(f"{path} changed while it was being stored; log it again")
            if before_commit is not None:
                before_commit(sha)
            if self.exists(sha):
                return sha, size, False
            key = self.key(sha)
            if single:
                with _refused_part(key), _prehashed():
                    self.client.put_object(
                        Bucket=self.bucket,
                        Key=key,
                        Body=_read_part(src.fileno(), bytearray(size), 0, key),
                        ChecksumSHA256=_b64(digests[0]),
                        Metadata={"sha256": sha},
                    )
                if progress is not None:
                    progress(size)
            else:
                self._upload_parts(src.fileno(), key, sha, size, part, digests, progress)
        after = os.stat(path)
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            # Every part matched its sha256 from the hashing pass, so the object holds the
            # hashed bytes (a valid object, collected if nothing references it); the file
            # itself is no longer what was stored.
            raise ArtifactError(f"{path} changed while it was being stored; log it again")
        return sha, size, True

    def _upload_parts(
        self,
        fd: int,
        key: str,
        sha: str,
        size: int,
        part: int,
        digests: list[bytes],
        progress: Callable[[int], Any] | None,
    ) -> None:
        """A multipart upload of the file open at ``fd``: part i is bytes [i*part, (i+1)*part)
        read with pread by one of ``max_concurrency`` threads, sent with the sha256 the
        hashing pass computed for it (the server refuses a part whose bytes differ:
        BadDigest). Any failure aborts the upload, so nothing stays behind but what
        :meth:`cleanup_partials` would find anyway after a crash."""
        upload_id = self.client.create_multipart_upload(
            Bucket=self.bucket, Key=key, ChecksumAlgorithm="SHA256", Metadata={"sha256": sha}
        )["UploadId"]

        def send(i: int) -> tuple[dict[str, Any], int]:
            n = min(part, size - i * part)
            buf = _take_part_buffer(n)
            try:
                with _prehashed():
                    resp = self.client.upload_part(
                        Bucket=self.bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=i + 1,
                        Body=_read_part(fd, buf, i * part, key),
                        ChecksumSHA256=_b64(digests[i]),
                    )
            finally:
                _give_part_buffer(buf, part)
            entry = {"PartNumber": i + 1, "ETag": resp["ETag"], "ChecksumSHA256": _b64(digests[i])}
            return entry, n

        pool = concurrent.futures.ThreadPoolExecutor(
            self.transfer.max_concurrency, thread_name_prefix="artifact-upload"
        )
        futures: list[concurrent.futures.Future[tuple[dict[str, Any], int]]] = []
        with _refused_part(key):
            try:
                futures = [pool.submit(send, i) for i in range(len(digests))]
                for fut in concurrent.futures.as_completed(futures):
                    _, n = fut.result()
                    if progress is not None:
                        progress(n)
                parts = [f.result()[0] for f in futures]
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )
            except BaseException:
                for f in futures:
                    f.cancel()
                pool.shutdown(wait=True)
                with contextlib.suppress(Exception):
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=key, UploadId=upload_id
                    )
                raise
            finally:
                pool.shutdown(wait=True)

    def put_stream(self, src: BinaryIO) -> tuple[str, int, bool]:
        with tempfile.NamedTemporaryFile(prefix="artifact-", suffix=".part") as tmp:
            shutil.copyfileobj(src, tmp, CHUNK)
            tmp.flush()
            return self.put_file(tmp.name)

    def get_to_file(self, sha256: str, dest: str | os.PathLike[str], size: int) -> None:
        from botocore.exceptions import ClientError

        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self.key(sha256))["Body"]
        except ClientError as exc:
            raise ArtifactError(
                f"artifact bytes {sha256} are missing from s3://{self.bucket}/{self.prefix}: "
                f"{exc.response.get('Error', {}).get('Code')}"
            ) from None
        try:
            _verify_stream(
                iter(lambda: body.read(CHUNK), b""),
                Path(dest),
                sha256,
                size,
                f"object {self.uri(sha256)}",
            )
        finally:
            body.close()

    def delete(self, sha256: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.key(sha256))

    def list_objects(self) -> Iterator[ObjectInfo]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=f"{self.prefix}objects/"):
            for obj in page.get("Contents", []):
                name = obj["Key"].rsplit("/", 1)[-1]
                if SHA_RE.fullmatch(name):
                    yield ObjectInfo(name, int(obj["Size"]), obj["LastModified"].timestamp())

    def cleanup_partials(self, older_than_s: float) -> int:
        """Abort multipart uploads a crashed writer left (older than the grace period)."""
        cutoff = time.time() - older_than_s
        n = 0
        resp = self.client.list_multipart_uploads(Bucket=self.bucket, Prefix=self.prefix)
        for up in resp.get("Uploads", []):
            if up["Initiated"].timestamp() <= cutoff:
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"]
                )
                n += 1
        return n


def open_artifact_store(location: str | os.PathLike[str]) -> ArtifactStore:
    """A store from a path (local) or ``s3://bucket/prefix?endpoint_url=http://...``.

    S3 credentials come from boto3's usual places (``AWS_ACCESS_KEY_ID`` ...).
    """
    text = os.fspath(location)
    if text.startswith("s3://"):
        url = urlparse(text)
        query = parse_qs(url.query)
        endpoint = query.get("endpoint_url", [os.environ.get("AWS_ENDPOINT_URL")])[0]
        return S3ArtifactStore(url.netloc, prefix=url.path, endpoint_url=endpoint)
    if text.startswith("file://"):
        text = urlparse(text).path
    if "://" in text:
        raise ArtifactError(
            f"unsupported artifact location {text!r}: use a directory path or "
            "s3://BUCKET/PREFIX?endpoint_url=URL"
        )
    return LocalArtifactStore(text)
