"""The S3 store's put against a real SeaweedFS: one read pass hashes the file and every part,
and each part is sent with its sha256 as its checksum, so the server itself refuses bytes
that differ from the ones the object's name hashes. A file edited between the hash and the
upload (same size, same mtime: invisible to a stat check) is refused with nothing left under
any key; a failure midway aborts the multipart upload; every size round-trips exactly."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from reference_impls.tracking.artifacts import S3ArtifactStore
from reference_impls.tracking.errors import ArtifactError

MiB = 1024 * 1024
PART = 5 * MiB  # the s3_store fixture's part size and multipart threshold (S3's minimum part)


def _uploads_in_flight(store: S3ArtifactStore) -> list[dict]:
    return store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("size", [0, 1, PART - 1, PART, PART + 1, 2 * PART + 12_345])
def test_every_size_round_trips_exactly_and_the_same_bytes_are_uploaded_once(
    s3_store, tmp_path, size
):
    data = np.random.default_rng(size).bytes(size)
    src = _write(tmp_path / "src.bin", data)
    seen: list[int] = []
    sha, n, new = s3_store.put_file(src, progress=seen.append)
    assert (sha, n, new) == (hashlib.sha256(data).hexdigest(), size, True)
    assert sum(seen) == size  # progress counts uploaded bytes, each once
    got = s3_store.client.get_object(Bucket=s3_store.bucket, Key=s3_store.key(sha))
    assert got["Body"].read() == data
    assert got["Metadata"] == {"sha256": sha}
    assert s3_store.put_file(src) == (sha, size, False)  # found, not uploaded again
    assert [o.sha256 for o in s3_store.list_objects()] == [sha]
    assert _uploads_in_flight(s3_store) == []


@pytest.mark.parametrize(
    "size",
    [PART - 100, 2 * PART + 12_345],  # a single PUT; a multipart upload (3 parts)
    ids=["single-put", "multipart"],
)
def test_a_file_edited_after_hashing_is_refused_by_the_server_and_nothing_is_kept(
    s3_store, tmp_path, size
):
    data = np.random.default_rng(1).bytes(size)
    src = _write(tmp_path / "src.bin", data)
    before = os.stat(src)
    names: list[str] = []

    def edit(sha: str) -> None:
        # Runs after the hashing pass, before the upload: another process rewrites one byte
        # in the last part in place and puts the mtime back, so size and mtime say nothing.
        names.append(sha)
        with open(src, "r+b") as f:
            f.seek(size - 7)
            f.write(bytes([data[size - 7] ^ 0xFF]))
        os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns))

    with pytest.raises(ArtifactError, match="changed while it was being stored"):
        s3_store.put_file(src, before_commit=edit)
    assert not s3_store.exists(names[0])  # nothing under the hashed name
    assert list(s3_store.list_objects()) == []
    assert _uploads_in_flight(s3_store) == []  # the multipart upload was aborted
    # The file as it is now stores normally, under its own hash.
    sha, _, new = s3_store.put_file(src)
    assert new and sha == hashlib.sha256(src.read_bytes()).hexdigest() != names[0]


@pytest.mark.parametrize("size", [PART - 100, 2 * PART + 12_345], ids=["single-put", "multipart"])
def test_a_file_cut_short_after_hashing_is_refused_and_nothing_is_kept(s3_store, tmp_path, size):
    # The parts are read again for the upload; a file truncated in between has fewer bytes
    # than were hashed: refused before anything under the hashed name exists.
    src = _write(tmp_path / "src.bin", np.random.default_rng(6).bytes(size))
    names: list[str] = []

    def cut(sha: str) -> None:
        names.append(sha)
        os.truncate(src, size - 1000)

    with pytest.raises(ArtifactError, match="changed while it was being stored"):
        s3_store.put_file(src, before_commit=cut)
    assert not s3_store.exists(names[0])
    assert list(s3_store.list_objects()) == []
    assert _uploads_in_flight(s3_store) == []


def test_a_failure_midway_aborts_the_multipart_upload(s3_store, tmp_path):
    src = _write(tmp_path / "src.bin", np.random.default_rng(2).bytes(3 * PART))

    def fail(_n: int) -> None:  # e.g. the caller's progress bar raising
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        s3_store.put_file(src, progress=fail)
    assert list(s3_store.list_objects()) == []
    assert _uploads_in_flight(s3_store) == []


def test_parts_smaller_than_s3_allows_are_raised_to_5_mib_as_boto3_does(s3_server, tmp_path):
    # S3 refuses parts under 5 MiB (but the last) and more than 10,000 parts; boto3's managed
    # transfer raises the part size to fit, and so must the store's own upload.
    client = s3_server.client()
    client.create_bucket(Bucket="t-small-parts")
    store = S3ArtifactStore(
        "t-small-parts", client=client, multipart_threshold=MiB, multipart_chunksize=MiB
    )
    data = np.random.default_rng(3).bytes(6 * MiB + 1)
    sha, _, _ = store.put_file(_write(tmp_path / "src.bin", data))
    head = client.head_object(Bucket="t-small-parts", Key=store.key(sha))
    assert head["ETag"].strip('"').endswith("-2")  # 5 MiB + (1 MiB + 1 byte), not 7 parts
    got = client.get_object(Bucket="t-small-parts", Key=store.key(sha))["Body"].read()
    assert got == data


def _headers_sent(client, ops: tuple[str, ...]) -> list[tuple[str, dict[str, str]]]:
    """Record (operation, the headers that matter here) of every request the client sends."""
    seen: list[tuple[str, dict[str, str]]] = []

    def record(request, event_name: str, **_) -> None:
        op = event_name.rsplit(".", 1)[-1]
        if op in ops:
            keep = ("x-amz-content-sha256", "x-amz-checksum-sha256", "x-amz-checksum-crc32")
            got = {k: request.headers.get(k) for k in keep}
            seen.append(
                (op, {k: v.decode() if isinstance(v, bytes) else v for k, v in got.items()})
            )

    client.meta.events.register("before-send.s3", record)
    return seen


@pytest.mark.parametrize("size", [PART - 100, 2 * PART + 12_345], ids=["single-put", "multipart"])
def test_parts_carry_their_hashed_sha256_and_other_requests_on_the_client_are_untouched(
    s3_store, tmp_path, size
):
    # Each part goes out with the sha256 the hashing pass took of it, in the signed checksum
    # header, and the body is not hashed again for the signature (UNSIGNED-PAYLOAD); the same
    # client's other uploads keep botocore's defaults (a signed payload hash and a CRC32).
    import base64

    data = np.random.default_rng(4).bytes(size)
    src = _write(tmp_path / "src.bin", data)
    seen = _headers_sent(s3_store.client, ("PutObject", "UploadPart"))
    s3_store.put_file(src)
    want = [
        base64.b64encode(hashlib.sha256(data[i : i + PART]).digest()).decode()
        for i in range(0, size, PART if size >= PART else size)
    ]
    assert sorted(h["x-amz-checksum-sha256"] for _, h in seen) == sorted(want)
    assert {h["x-amz-content-sha256"] for _, h in seen} == {"UNSIGNED-PAYLOAD"}
    assert {op for op, _ in seen} == ({"UploadPart"} if size >= PART else {"PutObject"})
    seen.clear()
    s3_store.client.put_object(Bucket=s3_store.bucket, Key="other", Body=b"hello")
    [(_, h)] = seen
    assert h["x-amz-content-sha256"] == hashlib.sha256(b"hello").hexdigest()
    assert h["x-amz-checksum-crc32"] is not None and h["x-amz-checksum-sha256"] is None
    seen.clear()  # a sha256 checksum of the caller's own does not turn its signing off either
    s3_store.client.put_object(
        Bucket=s3_store.bucket, Key="other", Body=b"hello", ChecksumAlgorithm="SHA256"
    )
    [(_, h)] = seen
    assert h["x-amz-content-sha256"] == hashlib.sha256(b"hello").hexdigest()
    assert (
        h["x-amz-checksum-sha256"] == base64.b64encode(hashlib.sha256(b"hello").digest()).decode()
    )


def test_a_client_that_asks_for_signed_payloads_keeps_them(s3_server, tmp_path):
    # payload_signing_enabled set on the client is the user's choice: the store leaves it.
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=s3_server.endpoint,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path", "payload_signing_enabled": True}),
        **s3_server.credentials(),
    )
    client.create_bucket(Bucket="t-signed")
    store = S3ArtifactStore("t-signed", client=client)
    data = np.random.default_rng(5).bytes(1000)
    seen = _headers_sent(client, ("PutObject",))
    sha, _, _ = store.put_file(_write(tmp_path / "src.bin", data))
    [(_, h)] = seen
    assert h["x-amz-content-sha256"] == sha == hashlib.sha256(data).hexdigest()
    assert client.get_object(Bucket="t-signed", Key=store.key(sha))["Body"].read() == data
