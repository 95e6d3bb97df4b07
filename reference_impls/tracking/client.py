"""The client API: ``Tracker`` and ``Run``.

    tracker = Tracker("runs.db", artifacts="artifacts/")            # embedded (SQLite + disk)
    tracker = Tracker.remote("http://127.0.0.1:8080", token="...")  # through the REST server
    with tracker.start_run("mnist", params={"lr": 1e-3, "opt": "adam"}) as run:
        for step in range(1000):
            run.log_metrics({"loss": loss, "acc": acc}, step=step)
        run.log_artifact("best.pt", kind="checkpoint")
        run.use("dataset:mnist@3")

Logging is buffered: ``log_metrics`` checks the values on the caller's thread (a bad value
raises there and nothing of that call is kept) and appends them to the run's buffer; one
background thread per tracker writes the runs' buffers in batches (one transaction each) when
a run holds ``flush_points`` points or its oldest buffered point is ``flush_interval_s`` old.
**What a crash loses**: only the points not yet flushed: those logged during the last
``flush_interval_s`` (1 s by default),
never more than ``max_buffered_points`` (100,000 by default): when the buffer is full,
``log_metrics`` waits for the writer instead of dropping points. A write that fails in the
background is raised by the next ``log_metrics``/``flush``/``finish`` on the caller's
thread, with the points still buffered. Leaving the ``with`` block writes what is left and
ends the run in one transaction (``failed`` if an exception escaped).
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reference_impls.tracking.errors import TrackingError
from reference_impls.tracking.metadata import MetricPoint, RunStatus, check_metric

__all__ = ["Run", "Tracker"]


class Tracker:
    """Entry point: wraps a backend (embedded or remote) and starts runs."""

    def __init__(
        self,
        db: str | os.PathLike[str] | None = None,
        artifacts: str | os.PathLike[str] | None = None,
        *,
        backend: Any = None,
        cache: Any = None,
        flush_points: int = 5_000,
        flush_interval_s: float = 1.0,
        max_buffered_points: int = 100_000,
    ) -> None:
        if backend is None:
            if db is None or artifacts is None:
                raise TrackingError(
                    "Tracker needs db and artifacts (e.g. Tracker('runs.db', 'artifacts/')), "
                    "a backend, or Tracker.remote(url, token)"
                )
            from reference_impls.tracking.backend import EmbeddedBackend

            backend = EmbeddedBackend(db, artifacts, cache=cache)
        if not 1 <= flush_points <= max_buffered_points:
            raise ValueError(
                f"need 1 <= flush_points ({flush_points}) <= max_buffered_points "
                f"({max_buffered_points})"
            )
        if not flush_interval_s > 0:
            raise ValueError(f"flush_interval_s must be > 0, got {flush_interval_s}")
        self.backend = backend
        self.flush_points = flush_points
        self.flush_interval_s = flush_interval_s
        self.max_buffered_points = max_buffered_points
        self._writer = _Writer(self)

    @classmethod
    def remote(cls, url: str, token: str, **kw: Any) -> Tracker:
        from reference_impls.tracking.remote import RemoteBackend

        return cls(backend=RemoteBackend(url, token), **kw)

    def start_run(
        self,
        project: str,
        *,
        name: str | None = None,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        git_commit: str | None = None,
        environment: Mapping[str, Any] | None = None,
        inputs: list[str] = (),  # type: ignore[assignment]
    ) -> Run:
        run_id = self.backend.create_run(
            project,
            name=name,
            params=dict(params or {}),
            tags=dict(tags or {}),
            git_commit=git_commit,
            environment=None if environment is None else dict(environment),
        )
        run = Run(self, run_id, project)
        if inputs:
            run.use(*inputs)
        return run

    def search(self, project: str, query: str = "", **kw: Any) -> Any:
        return self.backend.search(project, query, **kw)

    def lineage(self, node: str, direction: str = "backward") -> Any:
        return self.backend.lineage(node, direction)

    def get_run(self, run_id: str) -> Any:
        return self.backend.get_run(run_id)

    def download_artifact(self, run_id: str, name: str, dest: str | os.PathLike[str]) -> Path:
        return Path(self.backend.download_artifact(run_id, name, dest))

    def close(self) -> None:
        """Stop the background writer (after the batch it is writing) and close the backend.
        Finish runs first: points still buffered in an open run are not written."""
        self._writer.stop()
        self.backend.close()


class _Writer:
    """The tracker's one background thread: writes the buffers of its open runs.

    All runs of a tracker share this object's lock: their buffers, errors and flags are read
    and changed under it. Two conditions on that lock: ``work`` wakes the thread (a run is
    due, or has a deadline earlier than the one the thread sleeps until), ``idle`` wakes
    callers waiting for a write to end. The thread starts with the first buffered point, so a
    tracker that only searches has none, and a run that logs a few points and ends within the
    interval costs it nothing. A run is skipped while a write of it is in flight (here or in
    ``Run.flush``/``Run.finish``), so its batches are written in order, and while an error of
    it has not been seen by its caller yet.
    """

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker
        lock = threading.Lock()
        self.work = threading.Condition(lock)
        self.idle = threading.Condition(lock)
        self.runs: set[Run] = set()  # runs with buffered points (changed under the lock)
        self.wakeup_at = math.inf  # time.monotonic() the thread sleeps until
        self.recent = False  # a run had points since the thread last looked
        self.thread: threading.Thread | None = None
        self.stopped = False

    def wake(self, run: Run, deadline: float | None) -> None:
        """``run`` has buffered points, due at ``deadline`` (None: now). Under the lock."""
        self.runs.add(run)
        self.recent = True
        if self.thread is None and not self.stopped:
            self.thread = threading.Thread(target=self._loop, name="tracking-writer", daemon=True)
            self.thread.start()
        if deadline is None or deadline < self.wakeup_at:
            self.work.notify()

    def stop(self) -> None:
        with self.work:
            self.stopped = True
            self.work.notify()
            thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _due(self) -> tuple[list[Run], float | None]:
        """Runs to write now, and how long until the next one is due (None: none waiting)."""
        now = time.monotonic()
        interval = self.tracker.flush_interval_s
        due: list[Run] = []
        wait: float | None = None
        for run in list(self.runs):
            if not run._buf or run._closing:
                self.runs.discard(run)
                continue
            if run._inflight or run._error is not None:
                continue  # woken again when the write ends or the caller saw the error
            left = run._oldest + interval - now
            if len(run._buf) >= self.tracker.flush_points or left <= 0:
                due.append(run)
            else:
                wait = left if wait is None else min(wait, left)
        return due, wait

    def _loop(self) -> None:
        while True:
            with self.work:
                while not self.stopped:
                    due, wait = self._due()
                    if due:
                        break
                    if wait is None and self.recent:
                        # Runs come and go (short runs end before their deadline): tick once
                        # more instead of being notified by the next run's first point.
                        wait = self.tracker.flush_interval_s
                    self.recent = False
                    self.wakeup_at = math.inf if wait is None else time.monotonic() + wait
                    self.work.wait(wait)
                self.wakeup_at = 0.0  # awake: nobody needs to notify
                if self.stopped:
                    return
                batches = []
                for run in due:
                    batches.append((run, run._buf))
                    run._buf = []
                    run._inflight = True
            for run, batch in batches:
                try:
                    self.tracker.backend.log_metrics(run.id, batch)
                    run.points_flushed += len(batch)
                    run.batches_flushed += 1
                except BaseException as exc:  # kept and raised on the caller's thread
                    with self.idle:
                        run._buf[:0] = batch
                        run._error = exc
                        run._oldest = time.monotonic()  # tried again an interval later
                        self.runs.add(run)
            with self.idle:
                for run, _ in batches:
                    run._inflight = False
                self.idle.notify_all()


class Run:
    """One run; use it as a context manager (see the module docstring)."""

    def __init__(self, tracker: Tracker, run_id: str, project: str) -> None:
        self.tracker = tracker
        self.id = run_id
        self.project = project
        self._writer = tracker._writer
        self._cond = self._writer.idle  # its lock guards the fields below (a tracker's runs)
        self._buf: list[MetricPoint] = []
        self._oldest = 0.0  # time.monotonic() when the buffer last went from empty to not
        self._error: BaseException | None = None
        self._closing = False
        self._inflight = False  # a write of this run's points is in progress
        self.points_flushed = 0
        self.batches_flushed = 0

    # ------------------------------------------------------------------ logging
    def log_metrics(self, metrics: Mapping[str, Any], *, step: int) -> None:
        ts = time.time()
        points = [MetricPoint(k, step, check_metric(k, v, step), ts) for k, v in metrics.items()]
        with self._cond:
            self._raise_pending()
            if self._closing:
                raise TrackingError(f"run {self.id} is finished; it takes no more metrics")
            while len(self._buf) + len(points) > self.tracker.max_buffered_points:
                self._writer.wake(self, None)
                self._cond.wait(0.5)
                self._raise_pending()
            if not self._buf:
                self._oldest = time.monotonic()
                self._buf.extend(points)
                self._writer.wake(self, self._oldest + self.tracker.flush_interval_s)
            else:
                self._buf.extend(points)
            if len(self._buf) >= self.tracker.flush_points:
                self._writer.wake(self, None)

    def log_metric(self, key: str, value: float, *, step: int) -> None:
        self.log_metrics({key: value}, step=step)

    def _raise_pending(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            if self._buf:  # the writer may try again, an interval after the failure
                self._writer.wake(self, self._oldest + self.tracker.flush_interval_s)
            raise TrackingError(
                f"writing metrics of run {self.id} failed in the background: {err} "
                f"({len(self._buf)} points are still buffered; flush() tries again)"
            ) from err

    def _take(self) -> list[MetricPoint]:
        """Wait for a write in flight, then take the buffer (called under the condition);
        the caller writes it, then calls :meth:`_done`."""
        while self._inflight:
            self._cond.wait(0.5)
        self._raise_pending()
        batch, self._buf = self._buf, []
        self._inflight = True
        return batch

    def _done(self, batch: list[MetricPoint], error: BaseException | None) -> None:
        with self._cond:
            self._inflight = False
            if error is not None:
                self._buf[:0] = batch  # nothing lost: the caller sees the error
                self._oldest = time.monotonic()  # the writer tries again an interval later
            elif batch:
                self.points_flushed += len(batch)
                self.batches_flushed += 1
            if self._buf and not self._closing:
                self._writer.wake(self, self._oldest + self.tracker.flush_interval_s)
            self._cond.notify_all()

    def flush(self) -> None:
        """Write everything buffered now (blocks until it is stored)."""
        with self._cond:
            batch = self._take()
        try:
            if batch:
                self.tracker.backend.log_metrics(self.id, batch)
        except BaseException as exc:
            self._done(batch, exc)
            raise
        self._done(batch, None)

    # ------------------------------------------------------------------ the rest
    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.tracker.backend.set_tags(self.id, dict(tags))

    def log_artifact(
        self,
        path: str | os.PathLike[str],
        name: str | None = None,
        *,
        kind: str = "file",
        promoted: bool = False,
    ) -> Any:
        """Store a file's bytes (content-addressed) and reference them from this run."""
        return self.tracker.backend.log_artifact(self.id, path, name, kind=kind, promoted=promoted)

    def use(self, *nodes: str) -> None:
        """Record inputs: ``run.use("dataset:mnist@3", "artifact:<sha256>", "code:<commit>")``."""
        self.tracker.backend.add_edges([(n, f"run:{self.id}", "input") for n in nodes])

    def use_artifact(self, run_id: str, name: str, dest: str | os.PathLike[str]) -> Path:
        """Download another run's artifact and record it as this run's input."""
        path = Path(self.tracker.backend.download_artifact(run_id, name, dest))
        ref = next(a for a in self.tracker.backend.artifacts(run_id) if a.name == name)
        self.use(f"artifact:{ref.sha256}")
        return path

    def finish(self, status: RunStatus | str = RunStatus.FINISHED) -> None:
        """Write what is still buffered and end the run, in one transaction. If that fails
        the points stay buffered and ``finish`` can be called again; a background failure not
        seen yet is raised first (nothing is lost)."""
        with self._cond:
            self._closing = True  # the writer leaves this run alone from now on
            batch = self._take()
        try:
            self.tracker.backend.end_run(self.id, status, batch)
        except BaseException as exc:
            self._done(batch, exc)
            raise
        self._done(batch, None)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.finish(RunStatus.FINISHED)
            return
        with contextlib.suppress(TrackingError):  # the original exception is the one to see
            self.finish(RunStatus.FAILED)
