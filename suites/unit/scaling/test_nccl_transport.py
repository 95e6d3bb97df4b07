"""The NCCL_DEBUG=INFO parser on log text of the shape NCCL 2.18-2.28 prints."""

# ruff: noqa: E501 - the log lines are kept exactly as NCCL prints them

from __future__ import annotations

import pytest

from reference_impls.scaling import Transport, parse_nccl_log
from reference_impls.scaling.__main__ import main

# Two H200s of one host over NVLink (NCCL 2.28, NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET), two ranks
# interleaved, with the lines that are not about transports.
NVLINK_LOG = """\
gpu-host:4101:4101 [0] NCCL INFO Bootstrap: Using lo:127.0.0.1<0>
gpu-host:4101:4101 [0] NCCL INFO cudaDriverVersion 13000
gpu-host:4101:4101 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
gpu-host:4101:4190 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so.
gpu-host:4101:4190 [0] NCCL INFO NET/IB : No device found.
gpu-host:4101:4190 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>
gpu-host:4101:4190 [0] NCCL INFO Using network Socket
gpu-host:4102:4191 [1] NCCL INFO Using network Socket
gpu-host:4101:4190 [0] NCCL INFO comm 0x55d1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0
gpu-host:4101:4190 [0] NCCL INFO Pattern 4, crossNic 0, nChannels 16, bw 40.000000/40.000000, type NVL/PIX, sameChannels 1
gpu-host:4101:4190 [0] NCCL INFO Channel 00/16 :    0   1
gpu-host:4101:4190 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-host:4102:4191 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
gpu-host:4101:4190 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-host:4102:4191 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM/read
gpu-host:4101:4190 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-host:4101:4190 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
gpu-host:4101:4190 [0] NCCL INFO 16 coll channels, 16 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer
"""

# Two nodes, one GPU each, where IB is missing: NCCL falls back to TCP sockets; the same
# node's pair with P2P disabled goes through SHM.
FALLBACK_LOG = """\
node-a:77:77 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
node-a:77:120 [0] NCCL INFO NET/IB : No device found.
node-a:77:120 [0] NCCL INFO NET/Socket : Using [0]eth0:10.1.0.4<0>
node-a:77:120 [0] NCCL INFO Using network Socket
node-a:77:120 [0] NCCL INFO comm 0x7f rank 0 nRanks 3 nNodes 2 localRanks 2 localRank 0 MNNVL 0
node-a:77:120 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct
node-a:77:120 [0] NCCL INFO Channel 00/0 : 2[0] -> 0[0] [receive] via NET/Socket/0
node-a:77:120 [0] NCCL INFO Channel 00/0 : 1[1] -> 2[0] [send] via NET/Socket/0
NCCL WARN something unrelated
"""

IB_LOG = """\
n1:9:9 [3] NCCL INFO Using network IB
n1:9:40 [3] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>
n1:9:40 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA
n1:9:40 [3] NCCL INFO Channel 00 : 2[2] -> 3[3] via P2P/IPC
"""


def test_nvlink_p2p_is_recognised_and_raises_no_warning():
    report = parse_nccl_log(NVLINK_LOG.splitlines(), expect_nvlink=True)
    assert report.counts == {"P2P": 4}  # the repeated channel line counts once
    assert report.intra_node_link == "NVL"
    assert report.nccl_version == "2.28.9+cuda13.0"
    assert report.nodes == 1
    assert report.warnings == []  # one node: no IB device is no fallback (NCCL needs no network)
    assert report.no_ib_device


def test_shm_and_socket_fallbacks_are_warned_about():
    report = parse_nccl_log(FALLBACK_LOG.splitlines())
    assert report.counts == {"SHM": 1, "NET/Socket": 2}
    assert report.nodes == 2
    joined = " ".join(report.warnings)
    assert "shared memory (SHM)" in joined and "TCP sockets (NET/Socket)" in joined
    assert [c.transport for c in report.connections] == [
        Transport.SHM,
        Transport.NET_SOCKET,
        Transport.NET_SOCKET,
    ]


def test_infiniband_with_gpudirect_and_old_style_p2p_lines_are_parsed():
    report = parse_nccl_log(IB_LOG.splitlines())
    assert report.counts == {"NET/IB": 1, "P2P": 1}
    assert report.networks == ["IB"]
    assert "1 with GPUDirect RDMA" in report.summary
    assert report.warnings == []


def test_a_pcie_link_warns_when_nvlink_was_expected():
    log = NVLINK_LOG.replace("type NVL/PIX", "type PHB/PIX")
    report = parse_nccl_log(log.splitlines(), expect_nvlink=True)
    assert report.warnings == ["intra-node link type is PHB, not NVL (NVLink) as expected"]


def test_a_log_without_nccl_lines_says_so():
    report = parse_nccl_log(["hello", "world"])
    assert report.connections == []
    assert "was NCCL_DEBUG=INFO set" in report.summary


def test_the_transport_command_exits_1_on_a_fallback_and_2_on_a_missing_file(tmp_path, capsys):
    log = tmp_path / "nccl.log"
    log.write_text(FALLBACK_LOG)
    assert main(["transport", str(log)]) == 1
    assert "warning:" in capsys.readouterr().out
    good = tmp_path / "good.log"
    good.write_text(NVLINK_LOG)
    assert main(["transport", str(good), "--expect-nvlink"]) == 0
    assert main(["transport", str(tmp_path / "absent.log")]) == 2
    assert "no such log file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "what"),
    [(b"", "empty"), (bytes(range(256)) * 8, "not NCCL output"), (b"hello\nworld\n", "not NCCL")],
)
def test_an_empty_or_garbage_log_is_a_usage_error_not_a_transport_warning(
    content, what, tmp_path, capsys
):
    # Exit 1 means "NCCL fell back to a slow transport"; a log with nothing of NCCL's in it
    # says nothing about transports and used to exit 1 as if it did.
    log = tmp_path / "nccl.log"
    log.write_bytes(content)
    assert main(["transport", str(log)]) == 2
    err = capsys.readouterr().err
    assert f"{log} has no NCCL lines ({what}" in err and "NCCL_DEBUG=INFO" in err


def test_a_directory_is_named_as_one(tmp_path, capsys):
    assert main(["transport", str(tmp_path)]) == 2
    assert "a directory, not a log file" in capsys.readouterr().err


@pytest.mark.parametrize("line", ["NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NVLS/x"])
def test_unusual_transports_are_classified_not_dropped(line):
    assert parse_nccl_log([line]).counts == {"NVLS": 1}
