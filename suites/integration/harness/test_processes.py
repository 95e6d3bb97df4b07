"""A SIGTERM to ``harness`` ends the processes it started (harness/processes.py).

Real processes: the ``harness`` program (``harness.cli.run``) with one more command, which runs
a stand-in for asv through the same ``_stream`` the perf commands use. Like asv, the stand-in
starts its benchmark process in a process group of its own and does not end it when it is
interrupted itself; both sleep. ``harness`` then gets a SIGTERM, as a cancelled CI job's step
does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.processes import SIGTERM_EXIT

# asv's stand-in: a benchmark process in a group of its own (asv's setpgid), both PIDs said.
CHILD = (
    "import os, subprocess, sys, time\n"
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
    "                     preexec_fn=lambda: os.setpgid(0, 0))\n"
    "print(os.getpid(), p.pid, flush=True)\n"
    "time.sleep(600)\n"
)

# The harness program with a command that streams the stand-in as `harness perf` streams asv.
HARNESS = f"""
import os, sys
from pathlib import Path
import harness.cli
from harness.perf._common import _stream


@harness.cli.main.command("stand-in")
def stand_in():
    _stream([sys.executable, "-c", {CHILD!r}], cwd=Path("."), env=dict(os.environ),
            echo=lambda line: print(line, flush=True), log=[])


sys.argv = ["harness", "stand-in"]
harness.cli.{{entry}}()
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that a container may not have is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _start(tmp_path: Path, entry: str) -> tuple[subprocess.Popen[str], list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HARNESS.format(entry=entry)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    pids = [int(x) for x in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    return proc, pids


def test_a_sigterm_to_harness_ends_the_processes_it_started_and_exits_143(tmp_path):
    proc, pids = _start(tmp_path, "run")
    try:
        proc.send_signal(signal.SIGTERM)
        # Hang detectors, not speed claims: end_session waits 5 s after SIGINT and 5 s after
        # SIGTERM at most.
        assert proc.wait(timeout=60) == SIGTERM_EXIT
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in pids if _alive(p)], "left running after harness ended"
    finally:
        for pid in pids:  # started by this test: ended by PID if the assertion failed
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_without_the_program_entry_a_sigterm_ends_harness_alone(tmp_path):
    """What run() is for: `main` (as tests call it) keeps Python's default SIGTERM, which ends
    harness at once and leaves asv's processes running."""
    proc, pids = _start(tmp_path, "main")
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == -signal.SIGTERM
        assert all(_alive(p) for p in pids)
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
