"""A throwaway PostgreSQL cluster on loopback, for tests and benchmarks.

The recipe (docs/tracking.md, "PostgreSQL in tests"): find the newest
``/usr/lib/postgresql/<version>/bin``; ``initdb`` a fresh data directory with trust
authentication; start it with ``pg_ctl -w`` listening on 127.0.0.1 at a free port, its unix
socket in the same temporary directory; create a database; stop it with ``pg_ctl -m fast``.
PostgreSQL refuses to run as root, so as root every command runs as the ``postgres`` user
(``runuser -u postgres``) and the directory is handed to that user. initdb fails when a
parent directory is private (mode 0700, as ``mktemp -d`` makes them): the parent is opened
to 0755.

    with PostgresCluster.start(tmpdir) as pg:
        engine = open_engine(pg.url)

Nothing here imports pytest.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import socket
import subprocess
from pathlib import Path

__all__ = ["PostgresCluster", "PostgresError", "find_pg_bin"]


class PostgresError(RuntimeError):
    """The binaries are missing or the cluster did not start."""


_LIVE: set[PostgresCluster] = set()


@atexit.register
def _stop_all() -> None:
    for cluster in list(_LIVE):
        cluster.stop()


def find_pg_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/*/bin`` holding initdb, or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in Path(p).parts[-3].split(".")],
    )
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresCluster:
    def __init__(self, workdir: Path, bindir: Path, port: int) -> None:
        self.workdir = workdir
        self.bindir = bindir
        self.port = port
        self.running = False
        self.stop_mode = "fast"  # "immediate" for throwaway data: no checkpoint at shutdown

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/tracking"

    def _cmd(self, *args: str) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *args]
        return list(args)

    def _run(self, *args: str, timeout: float = 60) -> None:
        proc = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout)
        if proc.returncode:
            raise PostgresError(
                f"{' '.join(args)} failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout)[-2000:]}"
            )

    @classmethod
    def start(
        cls, workdir: str | os.PathLike[str], *, attempts: int = 3, durable: bool = False
    ) -> PostgresCluster:
        """Start a cluster. ``durable=False`` (tests) turns fsync off: a throwaway cluster needs
        no crash safety; benchmarks pass True to measure what a real server does."""
        bindir = find_pg_bin()
        if bindir is None:
            raise PostgresError(
                "PostgreSQL binaries not found under /usr/lib/postgresql/*/bin: "
                "apt-get install -y postgresql"
            )
        workdir = Path(workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        last: Exception | None = None
        for attempt in range(attempts):
            d = workdir / f"pg{attempt}"
            d.mkdir()
            for p in (d, *d.parents):
                if str(p) in ("/", "/tmp"):
                    break
                if os.geteuid() == 0:
                    p.chmod(p.stat().st_mode | 0o755)
            if os.geteuid() == 0:
                pw = pwd.getpwnam("postgres")
                os.chown(d, pw.pw_uid, pw.pw_gid)
            cluster = cls(d, bindir, _free_port())
            try:
                cluster._run(
                    str(bindir / "initdb"),
                    "-D",
                    str(d / "data"),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C.UTF-8",
                    "--no-sync",
                )
                cluster._run(
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(d / "data"),
                    "-l",
                    str(d / "pg.log"),
                    "-w",
                    "-t",
                    "60",
                    "start",
                    "-o",
                    f"-c listen_addresses=127.0.0.1 -c port={cluster.port} "
                    f"-c unix_socket_directories={d}" + ("" if durable else " -c fsync=off"),
                    timeout=90,
                )
                cluster.running = True
                _LIVE.add(cluster)
                cluster._run(
                    str(bindir / "createdb"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(cluster.port),
                    "-U",
                    "postgres",
                    "tracking",
                )
                return cluster
            except (PostgresError, subprocess.TimeoutExpired) as exc:
                last = exc
                cluster.stop()
        raise PostgresError(f"PostgreSQL did not start after {attempts} attempts: {last}")

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """A fresh database in this cluster (CREATE DATABASE over psycopg); its URL. A
        ``template`` database is copied (e.g. one already migrated: no migrations to run)."""
        import psycopg

        if not name.isidentifier() or len(name) > 63:
            raise ValueError(f"database name must be an identifier of <= 63 chars, got {name!r}")
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True
        ) as conn:
            if template is not None and not template.isidentifier():
                raise ValueError(f"template must be an identifier, got {template!r}")
            suffix = f' TEMPLATE "{template}"' if template else ""
            conn.execute(f'CREATE DATABASE "{name}"{suffix}')  # names checked: identifiers
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.running:
            try:
                self._run(
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.workdir / "data"),
                    "-m",
                    "fast",
                    "-w",
                    "stop",
                )
            finally:
                self.running = False
                _LIVE.discard(self)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.workdir / "pg.log").read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> PostgresCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
