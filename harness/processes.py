"""Child processes that must not outlive the ``harness`` command that started them.

``harness`` turns SIGTERM (a cancelled CI job, ``timeout``, a supervisor) into an ordinary exit
(:func:`exit_on_sigterm`), so that ``finally`` blocks and ``except BaseException`` handlers run
as they do on Ctrl-C; a command that starts a tree of processes (asv and its benchmark
processes, mutmut and its workers) starts it in a process group of its own and ends that group
on the way out (:func:`end_process_group`). Without both, a killed ``harness perf ci`` left
asv's benchmark processes running, orphaned, loading the machine after the job had gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Any

# The exit status a process killed by SIGTERM reports in a shell (128 + 15).
SIGTERM_EXIT = 128 + signal.SIGTERM


def exit_on_sigterm() -> None:
    """From now on SIGTERM raises SystemExit(143) in the main thread, which unwinds the stack."""

    def handler(signum: int, frame: Any) -> None:
        sys.exit(SIGTERM_EXIT)

    with contextlib.suppress(ValueError):  # not the main thread: leave the default
        signal.signal(signal.SIGTERM, handler)


def end_process_group(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """SIGTERM proc's process group (proc started with ``start_new_session=True``), wait up to
    grace_s for proc, then SIGKILL whatever is left of the group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
