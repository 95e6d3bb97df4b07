"""The local store's put: one read pass feeds the hash and the write, so an object's bytes are
exactly the bytes its name hashes, whatever the size (block-aligned or not, across chunk
edges, from a stream that returns short reads); a source that changes or fails mid-put leaves
no object and no temporary file; ``before_commit`` runs before the object is visible."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest

from reference_impls.tracking.artifacts import CHUNK, DIRECT_ALIGN, LocalArtifactStore
from reference_impls.tracking.errors import ArtifactError

SIZES = [
    0,
    1,
    DIRECT_ALIGN - 1,
    DIRECT_ALIGN,
    DIRECT_ALIGN + 1,
    CHUNK - 1,
    CHUNK,
    CHUNK + 1,
    3 * CHUNK + 12_345,  # more chunks than buffers: the buffers are reused
    5 * CHUNK,
]


class Trickle(io.RawIOBase):
    """A stream that returns fewer bytes than asked, by a varying amount (like a socket)."""

    def __init__(self, data: bytes, fail_after: int | None = None) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.fail_after = fail_after

    def readable(self) -> bool:
        return True

    def readinto(self, view) -> int:
        if self.fail_after is not None and self.pos >= self.fail_after:
            raise OSError("connection reset by peer")
        n = min(len(view), 1000 + self.pos % 7777, len(self.data) - self.pos)
        view[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


def _leftovers(store: LocalArtifactStore) -> list[Path]:
    return list(store.tmp.iterdir())


@pytest.mark.parametrize("size", SIZES)
def test_an_object_holds_exactly_the_bytes_its_name_hashes(tmp_path, size):
    data = np.random.default_rng(size).bytes(size)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    store = LocalArtifactStore(tmp_path / "store")  # fsync on: the real path
    seen: list[int] = []
    sha, n, new = store.put_file(src, progress=seen.append)
    assert (sha, n, new) == (hashlib.sha256(data).hexdigest(), size, True)
    assert store.path(sha).read_bytes() == data
    assert sum(seen) == size  # progress counts written bytes, each once
    again = LocalArtifactStore(tmp_path / "store2", fsync=False)
    assert again.put_stream(Trickle(data))[:2] == (sha, size)
    assert again.path(sha).read_bytes() == data
    assert store.put_file(src)[2] is False  # the same bytes again: stored once
    assert [o.sha256 for o in store.list_objects()] == [sha]
    assert _leftovers(store) == [] and _leftovers(again) == []


def test_before_commit_runs_once_the_hash_is_known_and_before_the_object_is_visible(tmp_path):
    data = np.random.default_rng(1).bytes(CHUNK + 5)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    store = LocalArtifactStore(tmp_path / "store", fsync=False)
    calls = []

    def before_commit(sha: str) -> None:
        calls.append((sha, store.exists(sha)))

    sha, _, _ = store.put_file(src, before_commit=before_commit)
    assert calls == [(sha, False)] and store.exists(sha)


def test_a_file_that_changes_while_it_is_stored_is_refused_and_nothing_is_kept(tmp_path):
    data = np.random.default_rng(2).bytes(3 * CHUNK)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    store = LocalArtifactStore(tmp_path / "store", fsync=False)

    def grow(_n: int) -> None:  # another process appending to the file mid-put
        with open(src, "ab") as f:
            f.write(b"more")

    with pytest.raises(ArtifactError, match="changed while it was being stored"):
        store.put_file(src, progress=grow)
    assert list(store.list_objects()) == [] and _leftovers(store) == []


def test_a_stream_that_fails_midway_leaves_no_object_and_no_partial_file(tmp_path):
    data = np.random.default_rng(3).bytes(3 * CHUNK)
    store = LocalArtifactStore(tmp_path / "store", fsync=False)
    with pytest.raises(OSError, match="connection reset"):
        store.put_stream(Trickle(data, fail_after=2 * CHUNK))
    assert list(store.list_objects()) == [] and _leftovers(store) == []
    # The store (and its reused buffers) work normally afterwards.
    sha, size, _ = store.put_stream(Trickle(data))
    assert store.path(sha).read_bytes() == data and size == len(data)


@pytest.mark.parametrize("refuse_after", [0, 1, 2])
def test_a_filesystem_that_refuses_direct_writes_gets_ordinary_ones_and_the_same_bytes(
    tmp_path, monkeypatch, refuse_after
):
    # Fault injection: some filesystems accept O_DIRECT at open and refuse the writes with
    # EINVAL (or accept a few first). The put must fall back to ordinary writes, keep every
    # byte, and leave no padding past the end.
    import errno
    import fcntl
    import os

    from reference_impls.tracking import artifacts

    if not artifacts.O_DIRECT:
        pytest.skip("no O_DIRECT on this platform: the fallback cannot be reached")
    real_pwrite = os.pwrite
    direct_writes = {"n": 0}

    def pwrite(fd, data, offset):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & artifacts.O_DIRECT:
            direct_writes["n"] += 1
            if direct_writes["n"] > refuse_after:
                raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(artifacts.os, "pwrite", pwrite)
    size = 3 * CHUNK + 12_345  # several chunks and a short, padded last one
    data = np.random.default_rng(7).bytes(size)
    store = LocalArtifactStore(tmp_path / "store")
    sha, n, _ = store.put_stream(io.BytesIO(data))
    assert (sha, n) == (hashlib.sha256(data).hexdigest(), size)
    assert store.path(sha).read_bytes() == data
    assert _leftovers(store) == []
    if direct_writes["n"] == 0:  # checked after: the open decides, on this filesystem
        pytest.skip(f"{tmp_path} refuses O_DIRECT at open: the write fallback was not reached")
    # After the first refusal no new direct write starts; the other writer threads may each
    # have one in flight already (refused too).
    assert refuse_after + 1 <= direct_writes["n"] <= refuse_after + artifacts.WRITERS


def test_without_direct_io_the_put_stores_the_same_bytes(tmp_path, monkeypatch):
    from reference_impls.tracking import artifacts

    monkeypatch.setattr(artifacts, "O_DIRECT", 0)  # what a platform without O_DIRECT sees
    data = np.random.default_rng(8).bytes(2 * CHUNK + 1)
    store = LocalArtifactStore(tmp_path / "store")
    sha, n, _ = store.put_stream(io.BytesIO(data))
    assert (sha, n) == (hashlib.sha256(data).hexdigest(), len(data))
    assert store.path(sha).read_bytes() == data


HASH_PART_CASES = [(0, 1), (10, 1)] + [  # (size, part): parts of one byte only on tiny data
    (size, part)
    for size in (0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 12_345)
    for part in (4096, 5 * 1024 * 1024, CHUNK, 2 * CHUNK + 1)
]


@pytest.mark.parametrize(("size", "part"), HASH_PART_CASES)
def test_the_s3_hashing_pass_gives_the_sha256_of_the_whole_and_of_every_part(size, part):
    # The S3 store names an object by the first sha256 and sends part i with digests[i] as its
    # checksum: all must be exactly what hashlib says of those bytes, across chunk and part
    # edges (part 0's digest is taken from the running whole-file hash), from a stream that
    # returns short reads too.
    from reference_impls.tracking.artifacts import hash_parts

    data = np.random.default_rng(size + part).bytes(size)
    want_parts = [hashlib.sha256(data[i : i + part]).digest() for i in range(0, size, part)]
    want = (hashlib.sha256(data).hexdigest(), size, want_parts or [hashlib.sha256().digest()])
    assert hash_parts(io.BytesIO(data), part) == want
    assert hash_parts(Trickle(data), part) == want


def test_the_s3_hashing_pass_refuses_a_part_size_that_is_not_positive():
    from reference_impls.tracking.artifacts import hash_parts

    with pytest.raises(ValueError, match="part size must be > 0, got 0"):
        hash_parts(io.BytesIO(b"x"), 0)
