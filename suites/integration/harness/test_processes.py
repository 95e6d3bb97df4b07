"""A SIGTERM to ``harness`` ends the processes it started (harness/processes.py).

Real processes: a stand-in for ``harness perf ci`` runs a stand-in for asv through the same
``_stream`` the perf commands use; that child starts a grandchild (asv's benchmark process)
and both sleep. The stand-in gets SIGTERM, as a cancelled CI job's step does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.processes import SIGTERM_EXIT

# asv's stand-in: starts a grandchild, says both PIDs, sleeps.
CHILD = (
    "import os, subprocess, sys, time\n"
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print(os.getpid(), p.pid, flush=True)\n"
    "time.sleep(600)\n"
)

HARNESS = f"""
import os, sys
from pathlib import Path
from harness.processes import exit_on_sigterm
from harness.perf._common import _stream

exit_on_sigterm()
_stream([sys.executable, "-c", {CHILD!r}], cwd=Path("."), env=dict(os.environ),
        echo=lambda line: print(line, flush=True), log=[])
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that a container may not have is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_sigterm_to_harness_ends_the_process_group_it_started(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", HARNESS], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    pids = [int(x) for x in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    proc.send_signal(signal.SIGTERM)
    # The bound is a hang detector, not a speed claim: the group's SIGTERM ends both sleepers
    # at once; end_process_group's own grace before SIGKILL is 10 s.
    assert proc.wait(timeout=60) == SIGTERM_EXIT
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "left running after harness ended"


def test_without_the_handler_the_same_sigterm_orphans_them(tmp_path):
    """What the handler is for: the default SIGTERM ends harness alone."""
    script = HARNESS.replace("exit_on_sigterm()\n", "")
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    pids = [int(x) for x in proc.stdout.readline().split()]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    try:
        assert all(_alive(p) for p in pids)
    finally:
        for pid in pids:  # started by this test: ended by PID
            os.kill(pid, signal.SIGKILL)
