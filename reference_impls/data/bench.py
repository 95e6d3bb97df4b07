"""Side-by-side speed of the streaming dataset against its baselines, in one run.

    python -m reference_impls.data.bench                      # starts a SeaweedFS on loopback
    python -m reference_impls.data.bench --shards 8 --shard-mb 64 --repeats 5 --json out.json

Writes ``--shards`` shards of about ``--shard-mb`` MB (samples of ``--sample-kb`` KB: a
``bin`` payload and a ``cls`` label) to a fresh bucket, then measures, interleaved (every
repeat runs every row once, in the same order, so machine drift hits all rows alike):

* **streaming**: :class:`ShardedDataset` over ``s3://`` (no cache, no shuffle buffer, shards in
  stored order; default settings otherwise) against a raw boto3 sequential GET of the same
  objects (``get_object(...)["Body"].iter_chunks(1 MiB)``, bytes discarded) and against the
  ``webdataset`` package reading the same shards through an in-process boto3 ``s3://`` handler
  (it has no built-in one; docs/platform.md: its fastest S3 path); also with sha256
  verification on, and an epoch that writes every shard into an empty cache;
* **cache**: an epoch served from a warm local cache, read through each shard's sample index
  (CRC32 check of every file before use, the default; the same with no read-ahead, so that
  the checks do not overlap the reading; a size check only; and the tar parsed instead of
  read by index, as before the index existed) against raw reads of the same cached files:
  ``read(n)`` calls of the mean sample size (bytes objects like the samples, no parsing, no
  check), whole-file ``Path.read_bytes()``, and ``readinto`` a reused 1 MiB buffer
  (page-cache bandwidth, nothing kept: an upper bound no reader that hands out data can
  reach); and the CRC32 check alone, as the cache runs it, over the same files; and, since
  the cache is on the node's disk in use (the dataset is larger than memory), the CRC-checked
  epoch and the raw reads again with the cached files dropped from the page cache first
  (``posix_fadvise(DONTNEED)``, untimed), so that they are read from the disk;
* **time to first sample**: a fresh dataset's first sample vs downloading the first shard
  whole (into memory; and into a file) and then parsing its first sample.

Throughput is bytes of shard objects per second (MB = 1e6 bytes), median over repeats; a
ratio is the median of per-repeat ratios against the row's baseline. Prints a markdown table
(``docs/benchmarks/data.md`` holds the recorded one) and optionally writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from .cache import ShardCache, _map
from .manifest import Manifest
from .s3 import S3Config, S3Source
from .seaweedfs import SeaweedServer
from .tario import iter_samples, sample_bytes
from .writer import ShardWriter, WriterConfig

# (row, baseline row, target ratio or None): the comparisons the requirements ask for, and the
# stricter or looser ones next to them so that a reader sees what each ratio depends on.
COMPARISONS = [
    ("stream", "boto3 GET", 0.9),
    ("stream", "webdataset (boto3 handler)", 1.0),
    ("stream + sha256 verify", "boto3 GET", None),
    ("stream + cache write (miss epoch)", "boto3 GET", None),
    ("cache hit (crc32 check)", "file read(sample size)", 0.9),
    ("cache hit (crc32 check)", "file read_bytes()", None),
    ("cache hit (crc32 check)", "file readinto(1 MiB), nothing kept", None),
    ("cache hit (crc32 check), no read-ahead", "file read(sample size)", None),
    ("cache hit (size check only)", "file read(sample size)", None),
    ("cache hit, tar parsed (crc32 check)", "file read(sample size)", None),
    ("cache hit, tar parsed (size check only)", "file read(sample size)", None),
    ("crc32 check only", "file read(sample size)", None),
    # The cache lives on the node's disk (the dataset is larger than memory): the same epoch
    # and the same raw reads with the cached files dropped from the page cache first.
    ("cache hit (crc32 check), from disk", "file read(sample size), from disk", 0.9),
    ("cache hit (crc32 check), from disk", "file read_bytes(), from disk", None),
]


def _write_dataset(
    url: str, s3: S3Config, shards: int, shard_mb: float, sample_kb: float, seed: int
) -> Manifest:
    rng = np.random.default_rng(seed)
    sample = int(sample_kb * 1000)
    pool = rng.bytes(64 << 20)  # samples are slices of one random pool: generation is not timed
    # Tar footprint of one sample: a header and padded data per member, for bin and cls.
    footprint = sum(len(p) for p in sample_bytes("00000000", {"bin": pool[:sample], "cls": b"999"}))
    per_shard = max(1, int(shard_mb * 1e6 // footprint))
    config = WriterConfig(target_shard_bytes=per_shard * footprint + 1024)
    with ShardWriter(url, config, s3=s3) as writer:
        for i in range(shards * per_shard):
            off = int(rng.integers(0, len(pool) - sample))
            writer.write(
                {"__key__": f"{i:08d}", "bin": pool[off : off + sample], "cls": str(i % 1000)}
            )
        return writer.close()


def _no_index(self: ShardCache, path: Path, fd: int, shard: Any) -> tuple[None, Any]:
    """Stands in for ``ShardCache._index`` in the "tar parsed" rows: no index, a map of the
    tar, as every hit was read before the index existed."""
    return None, _map(fd)


def _drop_from_page_cache(paths: list[Path]) -> None:
    """Ask the kernel to drop these files' pages (``POSIX_FADV_DONTNEED``; no privileges
    needed, other files untouched), so that the next read of them comes from the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # only clean pages are dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _consume(samples: Iterator[dict[str, Any]]) -> int:
    n = 0
    for sample in samples:
        n += len(sample["bin"])
    return n


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.workdir:
        return _run(args, Path(args.workdir))
    with tempfile.TemporaryDirectory(prefix="data-bench-") as tmp:  # ~2x the data: removed after
        return _run(args, Path(tmp))


def _run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from .dataset import DatasetConfig, ShardedDataset

    load_before = os.getloadavg()[0]

    server = None
    if args.endpoint:
        endpoint = args.endpoint
        s3 = S3Config(endpoint_url=endpoint)
    else:
        server = SeaweedServer.start(workdir / "seaweedfs")
        endpoint = server.endpoint
        creds = server.credentials()
        s3 = S3Config(
            endpoint_url=endpoint,
            access_key_id=creds["aws_access_key_id"],
            secret_access_key=creds["aws_secret_access_key"],
        )
    try:
        source = S3Source(f"s3://{args.bucket}/bench", s3)
        client = source.client()
        with contextlib.suppress(Exception):
            client.create_bucket(Bucket=args.bucket)
        t_write, manifest = _timed(
            lambda: _write_dataset(
                source.url, s3, args.shards, args.shard_mb, args.sample_kb, args.seed
            )
        )
        total = manifest.total_bytes
        print(
            f"wrote {len(manifest.shards)} shards, {total / 1e6:.0f} MB, "
            f"{manifest.total_samples} samples in {t_write:.1f} s",
            file=sys.stderr,
        )
        keys = [source.key(s.name) for s in manifest.shards]
        cache_dir = workdir / "cache"

        def dataset(**kw: Any) -> ShardedDataset:
            config = DatasetConfig(s3=s3, shuffle_buffer=0, shuffle_shards=False, **kw)
            return ShardedDataset(source, config, manifest=manifest)

        def raw_get() -> int:
            n = 0
            for key in keys:
                for chunk in client.get_object(Bucket=args.bucket, Key=key)["Body"].iter_chunks(
                    1 << 20
                ):
                    n += len(chunk)
            return n

        import webdataset as wds
        import webdataset.gopen  # noqa: F401 - the module (the package re-exports a function)

        def open_s3(url: str, mode: str = "rb", bufsize: int = 8192, **_: Any) -> Any:
            bucket, _sep, key = url[len("s3://") :].partition("/")
            return client.get_object(Bucket=bucket, Key=key)["Body"]

        sys.modules["webdataset.gopen"].gopen_schemes["s3"] = open_s3
        urls = [source.location(s.name) for s in manifest.shards]

        def webdataset_read() -> int:
            return _consume(iter(wds.WebDataset(urls, shardshuffle=False)))

        def miss_epoch() -> int:  # streams and writes every shard into an emptied cache
            shutil.rmtree(cache_dir / "miss", ignore_errors=True)
            return _consume(
                iter(dataset(cache_dir=str(cache_dir / "miss"), cache_max_bytes=4 * total))
            )

        # A warm cache for the hit rows (one epoch that fills it).
        warm = cache_dir / "warm"
        _consume(iter(dataset(cache_dir=str(warm), cache_max_bytes=4 * total)))
        files = sorted(warm.glob("*.tar"))
        assert len(files) == len(manifest.shards), "the cache did not take every shard"
        sample_size = total // manifest.total_samples

        def cache_hit(verify: str, *, parse: bool = False, **kw: Any) -> Callable[[], int]:
            def run() -> int:
                ds = dataset(
                    cache_dir=str(warm), cache_max_bytes=4 * total, cache_verify=verify, **kw
                )
                if not parse:
                    return _consume(iter(ds))
                # The reader before the index: every hit hands over a map of the tar, parsed.
                with mock.patch.object(ShardCache, "_index", _no_index):
                    return _consume(iter(ds))

            return run

        checker = ShardCache(warm, 4 * total)
        by_name = {s.sha256: s for s in manifest.shards}

        def crc_only() -> int:  # the check a hit runs before its first sample, and nothing else
            for p in files:
                shard = by_name[p.name[:64]]
                fd = os.open(p, os.O_RDONLY)
                try:
                    assert checker._verify(fd, shard.size, shard, p)
                finally:
                    os.close(fd)
            return total

        def read_bytes() -> int:
            return sum(len(p.read_bytes()) for p in files)

        def read_samples() -> int:
            n = 0
            for p in files:
                with open(p, "rb", buffering=0) as f:
                    while data := f.read(sample_size):
                        n += len(data)
            return n

        def readinto_chunks() -> int:
            n = 0
            buf = bytearray(1 << 20)
            for p in files:
                with open(p, "rb", buffering=0) as f:
                    while k := f.readinto(buf):
                        n += k
            return n

        cached_files = sorted(p for p in warm.iterdir() if p.suffix in (".tar", ".idx"))

        def from_disk(fn: Callable[[], int]) -> tuple[Callable[[], None], Callable[[], int]]:
            return (lambda: _drop_from_page_cache(cached_files)), fn

        rows: dict[str, Callable[[], int] | tuple[Callable[[], None], Callable[[], int]]] = {
            "boto3 GET": raw_get,
            "stream": lambda: _consume(iter(dataset())),
            "stream + sha256 verify": lambda: _consume(iter(dataset(verify_downloads=True))),
            "webdataset (boto3 handler)": webdataset_read,
            "stream + cache write (miss epoch)": miss_epoch,
            "file read_bytes()": read_bytes,
            "file read(sample size)": read_samples,
            "file readinto(1 MiB), nothing kept": readinto_chunks,
            "cache hit (crc32 check)": cache_hit("crc32"),
            "cache hit (crc32 check), no read-ahead": cache_hit("crc32", prefetch_depth=0),
            "cache hit (size check only)": cache_hit("size"),
            "cache hit, tar parsed (crc32 check)": cache_hit("crc32", parse=True),
            "cache hit, tar parsed (size check only)": cache_hit("size", parse=True),
            "crc32 check only": crc_only,
            "file read(sample size), from disk": from_disk(read_samples),
            "file read_bytes(), from disk": from_disk(read_bytes),
            "cache hit (crc32 check), from disk": from_disk(cache_hit("crc32")),
        }
        times: dict[str, list[float]] = {name: [] for name in rows}
        for rep in range(args.repeats):
            for name, row in rows.items():
                if isinstance(row, tuple):  # (untimed preparation, timed row)
                    row[0]()
                    row = row[1]
                # Rates use the objects' bytes for every row: each row reads all of them.
                times[name].append(_timed(row)[0])
            print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr)

        # Time to first sample, first shard.
        first = manifest.shards[0]
        ttfs: dict[str, list[float]] = {
            "stream": [],
            "download then parse (memory)": [],
            "download to file then parse": [],
        }
        for _ in range(args.repeats):
            ds = dataset()  # built outside the timing, as a training job builds it once
            t0 = time.perf_counter()
            it: Any = iter(ds)  # a generator: closed below
            next(it)
            ttfs["stream"].append(time.perf_counter() - t0)
            it.close()

            def in_memory() -> None:
                data = client.get_object(Bucket=args.bucket, Key=keys[0])["Body"].read()
                next(iter_samples([data], first.name))

            def via_file() -> None:
                path = workdir / "first.tar"
                client.download_file(args.bucket, keys[0], str(path))
                with open(path, "rb") as f:
                    next(iter_samples([f.read()], first.name))

            ttfs["download then parse (memory)"].append(_timed(in_memory)[0])
            ttfs["download to file then parse"].append(_timed(via_file)[0])
    finally:
        if server is not None:
            server.stop()

    result: dict[str, Any] = {
        "command": " ".join(
            [Path(sys.executable).name, "-m", "reference_impls.data.bench", *sys.argv[1:]]
        ),
        "date": time.strftime("%Y-%m-%d"),
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
        "shards": len(manifest.shards),
        "total_mb": total / 1e6,
        "samples": manifest.total_samples,
        "repeats": args.repeats,
        "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "rows": {},
        "time_to_first_sample_s": {k: statistics.median(v) for k, v in ttfs.items()},
    }
    for name, ts in times.items():
        result["rows"][name] = {
            "mb_s": total / statistics.median(ts) / 1e6,
            "mb_s_each": [round(total / t / 1e6, 1) for t in ts],
        }
    result["comparisons"] = [
        {
            "row": row,
            "baseline": base,
            "target": target,
            "ratio": statistics.median(b / t for b, t in zip(times[base], times[row], strict=True)),
        }
        for row, base, target in COMPARISONS
    ]
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"`{result['command']}` on {result['machine']}, {result['date']}: {result['shards']} "
        f"shards, {result['total_mb']:.0f} MB, {result['samples']} samples, median of "
        f"{result['repeats']} interleaved repeats; 1-minute load average "
        f"{result['load_average_1min'][0]} before, {result['load_average_1min'][1]} after.",
        "",
        "| row | MB/s (median) | MB/s (each repeat) |",
        "|---|---:|---|",
    ]
    for name, row in result["rows"].items():
        each = ", ".join(f"{v:.0f}" for v in row["mb_s_each"])
        lines.append(f"| {name} | {row['mb_s']:.0f} | {each} |")
    lines += [
        "",
        "| row | vs | ratio (median of per-repeat ratios) | target | met |",
        "|---|---|---:|---:|---|",
    ]
    for c in result["comparisons"]:
        target = f">= {c['target']:.1f}x" if c["target"] is not None else ""
        met = "" if c["target"] is None else ("yes" if c["ratio"] >= c["target"] else "**no**")
        lines.append(f"| {c['row']} | {c['baseline']} | {c['ratio']:.2f}x | {target} | {met} |")
    lines += ["", "| time to first sample (first shard) | median s |", "|---|---:|"]
    for name, t in result["time_to_first_sample_s"].items():
        lines.append(f"| {name} | {t:.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reference_impls.data.bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-mb", type=float, default=64.0)
    parser.add_argument("--sample-kb", type=float, default=100.0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--endpoint", help="an existing S3 endpoint (default: start SeaweedFS)")
    parser.add_argument("--bucket", default="data-bench")
    parser.add_argument(
        "--workdir", help="where the server's data and the cache go (default: a temp dir)"
    )
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    result = run(args)
    print(markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
