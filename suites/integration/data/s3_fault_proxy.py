"""A fault-injecting TCP proxy for loopback tests: cuts responses after N bytes, adds delays.

Runs an asyncio server on 127.0.0.1 in a background thread and forwards every connection to
an upstream port. Faults apply to the upstream -> client direction (the responses):

* ``cut_after``: after this many response bytes on a connection, the client side is closed
  abruptly, with a TCP reset (``cut="rst"``: the client sees ConnectionResetError, botocore
  a ResponseStreamingError) or an orderly FIN (``cut="fin"``: a short body, IncompleteRead);
* ``delay_s``: sleep before forwarding each piece of at most ``piece_bytes`` bytes;
* ``faulty_connections``: only the first N connections get faults (None: all of them).

boto3 pools connections: after changing faults, give the reader a new client (or a new
source) so that no connection made under the old settings is reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import struct
import threading
from typing import Any

__all__ = ["FaultProxy", "Faults"]


@dataclasses.dataclass
class Faults:
    cut_after: int | None = None
    cut: str = "rst"
    delay_s: float = 0.0
    piece_bytes: int = 16384
    faulty_connections: int | None = None

    def __post_init__(self) -> None:
        if self.cut not in ("rst", "fin"):
            raise ValueError(f"cut must be 'rst' or 'fin', got {self.cut!r}")
        if self.cut_after is not None and self.cut_after < 1:
            raise ValueError(f"cut_after must be >= 1, got {self.cut_after}")


class FaultProxy:
    """``with FaultProxy(upstream_port, Faults(cut_after=30_000)) as proxy: proxy.endpoint``"""

    def __init__(self, upstream_port: int, faults: Faults | None = None) -> None:
        self.upstream_port = upstream_port
        self.faults = faults or Faults()
        self.connections = 0
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self.port = 0

    # ----------------------------------------------------------------------- lifecycle
    def __enter__(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fault proxy did not start within 10 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()

    # ----------------------------------------------------------------------- forwarding
    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        faults = dataclasses.replace(self.faults)  # settings as of this connection's start
        faulty = faults.faulty_connections is None or number <= faults.faulty_connections
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            self._reset(client_w)
            return
        to_upstream = asyncio.ensure_future(self._pipe(client_r, up_w))
        try:
            await self._respond(up_r, client_w, faults if faulty else Faults())
        finally:
            to_upstream.cancel()
            up_w.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _respond(
        self, up_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, faults: Faults
    ) -> None:
        sent = 0
        try:
            while data := await up_r.read(faults.piece_bytes):
                if faults.delay_s:
                    await asyncio.sleep(faults.delay_s)
                if faults.cut_after is not None and sent + len(data) >= faults.cut_after:
                    client_w.write(data[: faults.cut_after - sent])
                    await client_w.drain()
                    self.cuts += 1
                    if faults.cut == "rst":
                        self._reset(client_w)
                    else:
                        client_w.close()
                    return
                client_w.write(data)
                await client_w.drain()
                sent += len(data)
        except ConnectionError:
            pass
        client_w.close()

    @staticmethod
    def _reset(writer: asyncio.StreamWriter) -> None:
        """Close with RST: SO_LINGER on with a zero timeout discards unsent data."""
        sock: Any = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
