"""The lean tar parser and writer, the manifest, the writer's cutting, config validation.

The parser must group bytes into the same samples as ``tarfile`` + webdataset's grouping,
whatever the chunking of the stream, and fail loudly (naming the shard and the byte) on
anything damaged.
"""

from __future__ import annotations

import io
import json
import random
import tarfile

import pytest

from reference_impls.data import (
    Manifest,
    ManifestError,
    Metrics,
    ProgressDisplay,
    RetryConfig,
    S3Config,
    ShardFormatError,
    ShardInfo,
    ShardWriter,
    WriterConfig,
    build_manifest,
)
from reference_impls.data.tario import END_OF_ARCHIVE, iter_samples, sample_bytes, split_key


def archive(samples: list[dict[str, bytes]]) -> bytes:
    parts = []
    for s in samples:
        parts += sample_bytes(s["__key__"], {k: v for k, v in s.items() if k != "__key__"})
    return b"".join(parts) + END_OF_ARCHIVE


def make_samples(rng: random.Random, n: int) -> list[dict[str, bytes]]:
    return [
        {
            "__key__": f"dir/s{i:04d}",
            "bin": rng.randbytes(rng.randrange(0, 3000)),
            "cls": str(i).encode(),
        }
        for i in range(n)
    ]


def chunked(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_samples_round_trip_whatever_the_chunking(seed):
    rng = random.Random(seed)
    samples = make_samples(rng, 40)
    data = archive(samples)
    for size in (1, 7, 511, 512, 513, 4096, len(data)):
        assert list(iter_samples(chunked(data, size), "s.tar")) == samples


def test_tarfile_reads_our_archives_member_for_member(seed):
    samples = make_samples(random.Random(seed), 5)
    with tarfile.open(fileobj=io.BytesIO(archive(samples))) as tf:
        names = [m.name for m in tf]
        assert names == [f"{s['__key__']}.{ext}" for s in samples for ext in ("bin", "cls")]
        assert tf.extractfile(names[0]).read() == samples[0]["bin"]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_we_read_archives_written_by_tarfile_in_every_format(fmt):
    long_dir = "d" * 120  # over 100 chars: ustar prefix field, GNU 'L' member, pax path
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for key, ext, data in [
            ("a", "txt", b"x"),
            ("a", "JSON", b"{}"),
            (f"{long_dir}/b", "bin", b"yy"),
        ]:
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        d = tarfile.TarInfo("somedir")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
    got = list(iter_samples([buf.getvalue()], "t.tar"))
    # Extensions are lower-cased as webdataset does; the directory entry is skipped.
    assert got == [
        {"__key__": "a", "txt": b"x", "json": b"{}"},
        {"__key__": f"{long_dir}/b", "bin": b"yy"},
    ]


def test_members_without_a_key_and_metadata_members_are_skipped():
    data = archive([{"__key__": "k1", "txt": b"1"}])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name in ("__index__", "__meta__/x.json", "README", "k1.txt"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"1"))
    assert list(iter_samples([buf.getvalue()], "t.tar")) == list(iter_samples([data], "t.tar"))


def test_split_key_follows_webdataset_base_plus_ext():
    assert split_key("a/b.seg.png") == ("a/b", "seg.png")
    assert split_key("x.y/z.txt") == ("x.y/z", "txt")
    assert split_key("noext") is None
    assert split_key("dir/.hidden") is None


def test_skip_stop_and_drain_select_samples_and_count_the_shard(seed):
    samples = make_samples(random.Random(seed), 10)
    data = archive(samples)
    counts = [-1]
    got = list(iter_samples(chunked(data, 1000), "s", skip=3, stop=6, drain=True, counts=counts))
    assert got == samples[3:6] and counts == [10]
    counts = [-1]
    got = list(iter_samples(chunked(data, 1000), "s", skip=3, stop=6, drain=False, counts=counts))
    assert got == samples[3:6] and counts == [-1]  # stopped early: the end was never read


def test_without_drain_the_rest_of_the_stream_is_never_read(seed):
    samples = make_samples(random.Random(seed), 10)
    pulled = []

    def chunks():
        for c in chunked(archive(samples), 512):
            pulled.append(c)
            yield c

    list(iter_samples(chunks(), "s", stop=2, drain=False))
    assert len(pulled) < len(chunked(archive(samples), 512)) // 2


def test_a_corrupt_header_is_an_error_naming_the_shard_and_byte(seed):
    samples = make_samples(random.Random(seed), 3)
    data = bytearray(archive(samples))
    second = 512 + len(samples[0]["bin"]) + (-len(samples[0]["bin"]) % 512)
    data[second + 5] ^= 0x01
    with pytest.raises(
        ShardFormatError, match=rf"shard 's3://b/x.tar': corrupt tar header at byte {second} "
    ):
        list(iter_samples([bytes(data)], "s3://b/x.tar"))


@pytest.mark.parametrize("cut", [100, 512 + 10, -1024, -600])
def test_a_truncated_archive_is_an_error_naming_the_shard(cut, seed):
    data = archive(make_samples(random.Random(seed), 3))
    with pytest.raises(ShardFormatError, match=r"shard 'x.tar' is truncated: it ends at byte"):
        list(iter_samples([data[:cut]], "x.tar"))


def test_two_members_with_one_extension_in_a_sample_are_an_error():
    data = (
        b"".join(sample_bytes("k", {"txt": b"a"}) + sample_bytes("k", {"txt": b"b"}))
        + END_OF_ARCHIVE
    )
    with pytest.raises(ShardFormatError, match=r"sample 'k' has two members with extension 'txt'"):
        list(iter_samples([data], "x.tar"))


# --------------------------------------------------------------------------- writer
def test_the_writer_cuts_shards_at_the_target_size(tmp_path, seed):
    rng = random.Random(seed)
    config = WriterConfig(target_shard_bytes=20_000)
    with ShardWriter(tmp_path, config) as w:
        for i in range(100):
            w.write({"__key__": f"k{i:04d}", "bin": rng.randbytes(rng.randrange(500, 3000))})
    manifest = Manifest.from_json((tmp_path / "manifest.json").read_text())
    assert len(manifest.shards) > 3
    assert all(s.size <= 20_000 for s in manifest.shards)
    assert manifest.total_samples == 100
    assert build_manifest(tmp_path) == manifest  # sizes, counts and hashes all agree
    assert not list(tmp_path.glob("*.part"))


def test_a_sample_larger_than_the_target_gets_a_shard_of_its_own(tmp_path):
    with ShardWriter(tmp_path, WriterConfig(target_shard_bytes=10_240)) as w:
        w.write({"__key__": "small", "bin": b"x" * 100})
        w.write({"__key__": "huge", "bin": b"x" * 50_000})
        w.write({"__key__": "small2", "bin": b"x" * 100})
    assert [s.num_samples for s in w.shards] == [1, 1, 1]


def test_the_writer_is_deterministic(tmp_path):
    def write(d):
        with ShardWriter(d) as w:
            for i in range(10):
                w.write({"__key__": f"k{i}", "txt": f"v{i}"})
        return w.shards

    assert write(tmp_path / "a") == write(tmp_path / "b")


@pytest.mark.parametrize(
    ("sample", "error", "message"),
    [
        ({"bin": b"x"}, ValueError, r"needs a '__key__'"),
        ({"__key__": "a.b", "bin": b"x"}, ValueError, r"key 'a.b' must be .* no '.'"),
        ({"__key__": "k", "BIN": b"x"}, ValueError, r"extension 'BIN' must be .*lower-case"),
        ({"__key__": "k", "bin": 3}, TypeError, r"field 'bin' must be bytes or str, got int"),
        ({"__key__": "k"}, ValueError, r"has no fields"),
    ],
)
def test_bad_samples_are_rejected_naming_what_is_wrong(tmp_path, sample, error, message):
    with ShardWriter(tmp_path) as w, pytest.raises(error, match=message):
        w.write(sample)


def test_a_key_repeated_by_the_next_sample_is_rejected(tmp_path):
    with ShardWriter(tmp_path) as w:
        w.write({"__key__": "k", "txt": "1"})
        with pytest.raises(ValueError, match=r"repeats the previous sample's key"):
            w.write({"__key__": "k", "txt": "2"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target_shard_bytes": 100}, r"target_shard_bytes must be >= 10240 .*got 100"),
        ({"name_pattern": "shard.tar"}, r"must contain \{index\}"),
        ({"name_pattern": "s-{i}.tar"}, r"str.format pattern using only \{index\}"),
    ],
)
def test_writer_config_errors_name_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WriterConfig(**kwargs)


# --------------------------------------------------------------------------- manifest
def _info(**kw) -> ShardInfo:
    return ShardInfo(**({"name": "a.tar", "size": 2048, "num_samples": 3, "sha256": "a" * 64} | kw))


def test_the_manifest_round_trips_through_json():
    m = Manifest((_info(), _info(name="b.tar", num_samples=0)))
    assert Manifest.from_json(m.to_json()) == m
    assert m.total_samples == 3 and m.total_bytes == 4096
    assert m.digest == Manifest.from_json(m.to_json()).digest


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"format": "other", "shards": []}, r"format must be 'ml-harness-shards/1', got 'other'"),
        (
            {"format": "ml-harness-shards/1", "shards": [], "extra": 1},
            r"unknown key\(s\) \['extra'\]",
        ),
        (
            {"format": "ml-harness-shards/1", "shards": [{"name": "a.tar"}]},
            r"shard entry 0 must have exactly",
        ),
    ],
)
def test_a_malformed_manifest_is_an_error_saying_what_is_wrong(doc, message):
    with pytest.raises(ManifestError, match=message):
        Manifest.from_json(json.dumps(doc), where="m.json")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"name": "../x.tar"}, r"relative path inside the dataset"),
        ({"size": 10}, r"size must be an int >= 1024"),
        ({"num_samples": -1}, r"num_samples must be an int >= 0, got -1"),
        ({"sha256": "xyz"}, r"sha256 must be 64 lower-case hex digits, got 'xyz'"),
    ],
)
def test_a_bad_shard_entry_is_an_error_naming_the_shard(kw, message):
    with pytest.raises(ManifestError, match=message):
        _info(**kw)


def test_a_shard_listed_twice_is_an_error():
    with pytest.raises(ManifestError, match=r"'a.tar' is listed twice"):
        Manifest((_info(), _info()))


# --------------------------------------------------------------------------- configs, metrics
def test_retry_delays_grow_exponentially_up_to_the_cap():
    retry = RetryConfig(backoff_initial_s=0.1, backoff_max_s=1.0, jitter=0.0)
    rng = random.Random(0)
    assert [retry.delay(k, rng) for k in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    jittered = RetryConfig(backoff_initial_s=0.1, backoff_max_s=1.0, jitter=0.25)
    assert all(0.075 <= jittered.delay(1, rng) <= 0.1 for _ in range(100))


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (RetryConfig, {"max_attempts": 0}, r"max_attempts must be >= 1, got 0"),
        (
            RetryConfig,
            {"backoff_initial_s": 2.0, "backoff_max_s": 1.0},
            r"backoff_initial_s <= backoff_max_s",
        ),
        (S3Config, {"multipart_part_size": 1 << 20}, r"multipart_part_size must be >= 5 MiB"),
        (S3Config, {"access_key_id": "a"}, r"give access_key_id and secret_access_key together"),
        (S3Config, {"addressing_style": "dns"}, r"got 'dns'"),
    ],
)
def test_config_errors_name_the_bad_value(cls, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cls(**kwargs)


def test_dataset_config_errors_name_the_bad_value():
    from reference_impls.data import DatasetConfig

    with pytest.raises(ValueError, match=r"cache_dir and cache_max_bytes together"):
        DatasetConfig(cache_dir="/tmp/x")
    with pytest.raises(ValueError, match=r"rank and world_size together"):
        DatasetConfig(rank=1)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        DatasetConfig(rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"buffer_bytes \(4096\) must be >= chunk_bytes \(8192\)"):
        DatasetConfig(chunk_bytes=8192, buffer_bytes=4096)


def test_the_progress_line_shows_counts_rates_cache_and_blocked_time():
    metrics = Metrics()
    metrics.add(
        bytes_network=5_000_000, cache_hits=2, cache_misses=1, retries=3, time_blocked_s=0.5
    )
    out = io.StringIO()
    display = ProgressDisplay(200, label="data rank 0/2", stream=out, interval_s=60)
    display.update(metrics, 50)
    display.update(metrics, 60)  # within the interval: not printed
    display.close(metrics, 200)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("data rank 0/2: 50/200 samples (25.0%) | ")
    assert (
        "MB/s" in lines[0]
        and "cache 2 hit 1 miss 0 corrupt | retries 3 | blocked 0.5 s" in lines[0]
    )
    assert lines[1].startswith("data rank 0/2: 200/200 samples (100.0%)")
