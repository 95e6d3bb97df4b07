"""The client API: ``Tracker`` and ``Run``.

    tracker = Tracker("runs.db", artifacts="artifacts/")            # embedded (SQLite + disk)
    tracker = Tracker.remote("http://127.0.0.1:8080", token="...")  # through the REST server
    with tracker.start_run("mnist", params={"lr": 1e-3, "opt": "adam"}) as run:
        for step in range(1000):
            run.log_metrics({"loss": loss, "acc": acc}, step=step)
        run.log_artifact("best.pt", kind="checkpoint")
        run.use("dataset:mnist@3")

Logging is buffered: ``log_metrics`` checks the values on the caller's thread (a bad value
raises there and nothing of that call is kept) and appends them to the run's buffer; a
background thread writes the buffer in batches (one transaction each) when it holds
``flush_points`` points or ``flush_interval_s`` has passed. **What a crash loses**: only the
points not yet flushed: those logged during the last ``flush_interval_s`` (1 s by default),
never more than ``max_buffered_points`` (100,000 by default): when the buffer is full,
``log_metrics`` waits for the writer instead of dropping points. A write that fails in the
background is raised by the next ``log_metrics``/``flush``/``finish`` on the caller's
thread, with the points still buffered. Leaving the ``with`` block flushes everything and
ends the run (``failed`` if an exception escaped).
"""

from __future__ import annotations

import contextlib
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
        self.backend.close()


class Run:
    """One run; use it as a context manager (see the module docstring)."""

    def __init__(self, tracker: Tracker, run_id: str, project: str) -> None:
        self.tracker = tracker
        self.id = run_id
        self.project = project
        self._buf: list[MetricPoint] = []
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._closing = False
        self._inflight = 0
        self._keys: set[str] = set()
        self.points_flushed = 0
        self.batches_flushed = 0
        self._thread = threading.Thread(
            target=self._writer, name=f"tracking-{run_id[:8]}", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ logging
    def log_metrics(self, metrics: Mapping[str, Any], *, step: int) -> None:
        ts = time.time()
        points = [MetricPoint(k, step, check_metric(k, v, step), ts) for k, v in metrics.items()]
        with self._cond:
            self._raise_pending()
            if self._closing:
                raise TrackingError(f"run {self.id} is finished; it takes no more metrics")
            while len(self._buf) + len(points) > self.tracker.max_buffered_points:
                self._cond.notify_all()
                self._cond.wait(0.5)
                self._raise_pending()
            self._buf.extend(points)
            if len(self._buf) >= self.tracker.flush_points:
                self._cond.notify_all()

    def log_metric(self, key: str, value: float, *, step: int) -> None:
        self.log_metrics({key: value}, step=step)

    def _raise_pending(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise TrackingError(
                f"writing metrics of run {self.id} failed in the background: {err} "
                f"({len(self._buf)} points are still buffered; flush() tries again)"
            ) from err

    def _writer(self) -> None:
        interval = self.tracker.flush_interval_s
        while True:
            with self._cond:
                deadline = time.monotonic() + interval
                while (
                    not self._closing
                    and len(self._buf) < self.tracker.flush_points
                    and (remaining := deadline - time.monotonic()) > 0
                ):
                    self._cond.wait(remaining)
                if self._error is not None and not self._closing:
                    self._cond.wait(interval)  # the caller has not seen the error yet
                    continue
                batch, self._buf = self._buf, []
                self._inflight = len(batch)
                closing = self._closing
            if batch:
                try:
                    self.tracker.backend.log_metrics(self.id, batch)
                    self.points_flushed += len(batch)
                    self.batches_flushed += 1
                except BaseException as exc:  # kept and raised on the caller's thread
                    with self._cond:
                        self._buf[:0] = batch
                        self._error = exc
            with self._cond:
                self._inflight = 0
                self._cond.notify_all()
                if closing and (not self._buf or self._error is not None):
                    return

    def flush(self) -> None:
        """Write everything buffered now (blocks until it is stored)."""
        with self._cond:
            self._raise_pending()
            batch, self._buf = self._buf, []
        if batch:
            try:
                self.tracker.backend.log_metrics(self.id, batch)
                self.points_flushed += len(batch)
                self.batches_flushed += 1
            except BaseException:
                with self._cond:
                    self._buf[:0] = batch
                raise
        with self._cond:
            while self._inflight:
                self._cond.wait(0.5)
            self._raise_pending()

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
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        self.flush()
        self.tracker.backend.end_run(self.id, status)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.finish(RunStatus.FINISHED)
            return
        with contextlib.suppress(TrackingError):  # the original exception is the one to see
            self.finish(RunStatus.FAILED)
