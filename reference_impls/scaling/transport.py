"""What transport NCCL picked, from its ``NCCL_DEBUG=INFO`` log, and a warning on a fallback.

NCCL prints one line per channel connection when it sets up a communicator, e.g. (NCCL 2.18+)::

    host:12:12 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
    host:12:12 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct
    host:12:12 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/IB/0/GDRDMA
    host:12:12 [1] NCCL INFO Channel 00/0 : 2[0] -> 1[1] [receive] via NET/Socket/0

and which network it loaded (``NCCL INFO Using network IB`` / ``Socket``), and, with
``NCCL_DEBUG_SUBSYS=GRAPH``, the topology search's link type (``type NVL/PIX``). P2P is a
direct GPU-to-GPU path (NVLink when the graph's intra-node type is ``NVL``, else PCIe); SHM
stages through host shared memory (NCCL's fallback when P2P is off or impossible); NET/IB is
InfiniBand/RoCE verbs (GPUDirect RDMA when ``GDRDMA`` is shown); NET/Socket is TCP, the
fallback when no IB device is found (``NET/IB : No device found``).

Get the log with ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET`` (and
``NCCL_DEBUG_FILE=/path/nccl.%h.%p`` to keep it out of stderr).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable
from enum import StrEnum
from typing import Any

__all__ = ["Connection", "Transport", "TransportReport", "parse_nccl_log"]


class Transport(StrEnum):
    P2P = "P2P"
    SHM = "SHM"
    NET_IB = "NET/IB"
    NET_SOCKET = "NET/Socket"
    COLLNET = "CollNet"
    NVLS = "NVLS"
    OTHER = "other"


# "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read" (NCCL >= 2.12) and the older
# "Channel 00 : 0[3000] -> 1[4000] via P2P/IPC"; an optional [send]/[receive] before "via".
_CHANNEL = re.compile(
    r"NCCL INFO Channel (?P<channel>\d+)(?:/\d+)?\s*:\s*(?P<src>\d+)\[[0-9a-fx]+\]\s*->\s*"
    r"(?P<dst>\d+)\[[0-9a-fx]+\](?:\s*\[(?P<dir>send|receive)\])?\s*via\s+(?P<via>\S+)"
)
_NETWORK = re.compile(r"NCCL INFO Using network (?P<net>\S+)")
_GRAPH_TYPE = re.compile(r"NCCL INFO Pattern \d+.*?type (?P<intra>[A-Z]+)/(?P<inter>[A-Z]+)")
_VERSION = re.compile(r"NCCL INFO NCCL version (?P<v>\S+)")
_NODES = re.compile(r"nRanks (?P<ranks>\d+) nNodes (?P<nodes>\d+)")
_NO_IB = re.compile(r"NET/IB\s*:\s*No device found")


@dataclasses.dataclass(frozen=True)
class Connection:
    channel: int
    src: int
    dst: int
    transport: Transport
    detail: str
    """What follows ``via``: ``P2P/CUMEM/read``, ``NET/IB/0/GDRDMA``, ..."""


def _transport(via: str) -> Transport:
    if via.startswith("P2P"):
        return Transport.P2P
    if via.startswith("SHM"):
        return Transport.SHM
    if via.startswith("NET/IB") or via.startswith("NET/IBext"):
        return Transport.NET_IB
    if via.startswith("NET/Socket"):
        return Transport.NET_SOCKET
    if via.startswith("COLLNET") or via.startswith("CollNet"):
        return Transport.COLLNET
    if via.startswith("NVLS"):
        return Transport.NVLS
    return Transport.OTHER


@dataclasses.dataclass
class TransportReport:
    connections: list[Connection]
    networks: list[str]
    intra_node_link: str | None
    """The topology search's intra-node type (NVL = NVLink, PIX/PXB/PHB/SYS = PCIe paths)."""
    nccl_version: str | None
    nodes: int | None
    no_ib_device: bool
    warnings: list[str]

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(str(c.transport) for c in self.connections))

    @property
    def summary(self) -> str:
        if not self.connections:
            return "no NCCL channel lines found (was NCCL_DEBUG=INFO set?)"
        parts = [f"{n} x {t}" for t, n in sorted(self.counts.items())]
        link = f", intra-node link {self.intra_node_link}" if self.intra_node_link else ""
        gdr = sum("GDRDMA" in c.detail for c in self.connections)
        extra = f", {gdr} with GPUDirect RDMA" if gdr else ""
        return "connections: " + ", ".join(parts) + link + extra

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "counts": self.counts,
            "networks": self.networks,
            "intra_node_link": self.intra_node_link,
            "nccl_version": self.nccl_version,
            "nodes": self.nodes,
            "no_ib_device": self.no_ib_device,
            "warnings": self.warnings,
        }


def parse_nccl_log(lines: Iterable[str], *, expect_nvlink: bool = False) -> TransportReport:
    """Parse NCCL INFO lines (any order, several ranks interleaved) into a :class:`TransportReport`.

    Warnings: connections over SHM (GPUs of one host that do not talk directly: P2P disabled,
    or no NVLink/PCIe peer access), over NET/Socket (TCP: no usable InfiniBand/RoCE), the IB
    plugin finding no device, and, with ``expect_nvlink``, an intra-node link other than NVL.
    """
    conns: list[Connection] = []
    seen: set[tuple[int, int, int, str]] = set()
    networks: list[str] = []
    intra = version = None
    nodes = None
    no_ib = False
    for line in lines:
        if "NCCL" not in line:
            continue
        if m := _CHANNEL.search(line):
            key = (int(m["channel"]), int(m["src"]), int(m["dst"]), m["via"])
            if key not in seen:
                seen.add(key)
                conns.append(Connection(key[0], key[1], key[2], _transport(m["via"]), m["via"]))
        elif m := _NETWORK.search(line):
            if m["net"] not in networks:
                networks.append(m["net"])
        elif m := _GRAPH_TYPE.search(line):
            intra = intra or m["intra"]
        elif m := _VERSION.search(line):
            version = m["v"]
        if m := _NODES.search(line):
            nodes = int(m["nodes"])
        if _NO_IB.search(line):
            no_ib = True
    warnings = []
    counts = Counter(c.transport for c in conns)
    if counts[Transport.SHM]:
        warnings.append(
            f"{counts[Transport.SHM]} connection(s) go through host shared memory (SHM), not "
            "GPU-to-GPU P2P: check NCCL_P2P_DISABLE / NCCL_P2P_LEVEL, peer access and the "
            "topology (nvidia-smi topo -m); SHM bandwidth is a fraction of NVLink's"
        )
    if counts[Transport.NET_SOCKET]:
        warnings.append(
            f"{counts[Transport.NET_SOCKET]} connection(s) use TCP sockets (NET/Socket): NCCL "
            "found no usable InfiniBand/RoCE device (NCCL_IB_DISABLE, NCCL_IB_HCA, drivers); "
            "expect a small fraction of the fabric's bandwidth"
        )
    if no_ib and not counts[Transport.NET_SOCKET] and nodes is not None and nodes > 1:
        # On one node NCCL never needs the network: a missing IB device is no fallback there.
        warnings.append("NCCL's IB transport found no device (NET/IB : No device found)")
    if expect_nvlink and intra is not None and intra != "NVL":
        warnings.append(f"intra-node link type is {intra}, not NVL (NVLink) as expected")
    if expect_nvlink and intra is None and counts[Transport.P2P] == 0 and conns:
        warnings.append("no P2P connection although NVLink was expected")
    return TransportReport(conns, networks, intra, version, nodes, no_ib, warnings)
