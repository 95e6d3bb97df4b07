"""Child processes that must not outlive the ``harness`` command that started them.

``harness`` turns SIGTERM (a cancelled CI job, ``timeout``, a supervisor) into what Ctrl-C
does (:func:`interrupt_on_sigterm`: a :class:`Terminated`, a ``KeyboardInterrupt``, so every
path that cleans up after Ctrl-C runs: pytest children get their SIGINT, partial reports are
written), and the program then exits 143 as a SIGTERM'd process does (``harness.cli.run``).
A command that starts a tree of processes (asv and its benchmark processes, mutmut and its
workers) starts it in a session of its own and ends the whole session on the way out
(:func:`end_session`). Without both, a killed ``harness perf ci`` left asv's benchmark
processes running, orphaned, loading the machine after the job had gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The exit status a process killed by SIGTERM reports in a shell (128 + 15).
SIGTERM_EXIT = 128 + signal.SIGTERM
# How long the session's leader gets to end its own children after SIGINT (asv kills the
# benchmark process it is waiting for), and the rest of the session after SIGTERM.
GRACE_S = 5.0


class Terminated(KeyboardInterrupt):
    """Raised in the main thread by a SIGTERM once :func:`interrupt_on_sigterm` ran."""


_received: list[int] = []  # the SIGTERMs the handler saw


def interrupt_on_sigterm() -> None:
    """From now on SIGTERM raises :class:`Terminated` in the main thread, as Ctrl-C raises
    KeyboardInterrupt (the same clean-up runs); ``harness.cli.run`` then exits 143, whatever
    exit the interrupted command chose (:func:`sigterm_received`)."""

    def handler(signum: int, frame: Any) -> None:
        _received.append(signum)
        raise Terminated(f"signal {signum}")

    with contextlib.suppress(ValueError):  # not the main thread: leave the default
        signal.signal(signal.SIGTERM, handler)


def sigterm_received() -> bool:
    """Whether a SIGTERM reached :func:`interrupt_on_sigterm`'s handler."""
    return bool(_received)


def _session(sid: int) -> list[int]:
    """The live processes of session sid (its leader's children keep the session when they
    make process groups of their own, as asv's benchmark processes do)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone since the listing
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
            pids.append(int(entry.name))
    return pids


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the clean-up runs: a second Ctrl-C or SIGTERM must not cut
    it short (they are delivered when it ends)."""
    held = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def end_session(proc: subprocess.Popen[Any], grace_s: float = GRACE_S) -> None:
    """End proc (started with ``start_new_session=True``) and every process of its session:
    SIGINT to proc, which asv and mutmut handle by ending their own children; after grace_s,
    SIGTERM to all that is left of the session; after grace_s more, SIGKILL."""
    with _signals_held():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            left = _session(proc.pid)
            if not left and proc.poll() is not None:
                break
            _signal_all([proc.pid] if sig == signal.SIGINT else left, sig)
            deadline = time.monotonic() + (grace_s if sig != signal.SIGKILL else 1.0)
            while time.monotonic() < deadline and (_session(proc.pid) or proc.poll() is None):
                time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
