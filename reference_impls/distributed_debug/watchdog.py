"""The watchdog thread: heartbeats, stall detection, publication through the store, the report.

The collectives themselves are stuck when a report is needed, so everything here goes through
the job's rendezvous key-value store (``torch.distributed.Store``), on a client of its own:

* every rank's heartbeat ``hb/<rank>`` (its newest records; sent each tick when there are new
  calls, else every ``heartbeat_s``, and before each call this rank has never made before),
  so a rank killed with SIGKILL or aborted by the backend is still known with its last calls;
* a rank whose oldest pending call is older than ``stall_s`` (or whose call raised) claims
  ``trigger`` with ``compare_set``: exactly one rank becomes the reporter;
* on seeing the trigger every live rank publishes its whole ring under ``records/<rank>``;
* the reporter waits for them (at most ``collect_s``, longer only for a rank whose heartbeat
  is not yet old enough to call it dead), merges, analyses (:mod:`.analysis`), writes
  ``report.txt``/``report.json`` and every rank's ``records/rankN.json`` under ``report_dir``,
  prints the report to stderr and sets ``report``.

All keys live under ``distdebug/<run_id>/s<session>/``; the run id is agreed with
``compare_set`` when the first tracer starts, so two runs sharing a store never mix, and each
tracing session of a process (each ``trace_collectives`` block) has keys of its own.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import PrefixStore, Store

from reference_impls.distributed_debug.config import TracerError
from reference_impls.distributed_debug.records import (
    RankDump,
    RankState,
    Record,
    RecordsError,
    check_same_run,
    parse_dump,
)

if TYPE_CHECKING:
    from reference_impls.distributed_debug.tracer import Tracer

__all__ = ["FINAL_RECORDS", "HEARTBEAT_RECORDS", "Watchdog", "open_store"]

_SESSIONS = itertools.count()

HEARTBEAT_RECORDS = 8
"""Newest records carried by each heartbeat: what is known of a rank that dies."""
FINAL_RECORDS = 256
"""Newest records a rank leaves in the store when its tracing session ends (~64 KiB): enough
to place it against ranks still running, without every rank of a large job writing its whole
ring at every session end. A stall publishes whole rings."""


def open_store(store: Store | None, timeout_s: float) -> Store:
    """A store client of the tracer's own: the main thread may be using (or stuck in) the
    default one. Raises TracerError if it cannot be reached."""
    if store is None:
        try:
            base = c10d._get_default_store()
        except (RuntimeError, ValueError) as exc:
            raise TracerError(
                f"the default process group has no store to publish through: {exc}"
            ) from exc
        inner = base
        while hasattr(inner, "underlying_store"):
            inner = inner.underlying_store
        if hasattr(inner, "clone"):
            try:
                store = inner.clone()
            except RuntimeError as exc:
                where = f"{getattr(inner, 'host', '?')}:{getattr(inner, 'port', '?')}"
                raise TracerError(
                    f"cannot open a second client of the rendezvous store at {where}: {exc}"
                ) from exc
        else:
            store = inner
    try:
        store.set_timeout(dt.timedelta(seconds=timeout_s))
        store.check(["distdebug/probe"])
    except (RuntimeError, dist.DistStoreError) as exc:
        where = f"{getattr(store, 'host', '?')}:{getattr(store, 'port', '?')}"
        raise TracerError(
            f"the rendezvous store at {where} is unreachable ({type(exc).__name__}: {exc}); the "
            "tracer publishes its records through it: check that the store's host (rank 0 or the "
            "torchrun agent) is up, or pass store= a reachable torch.distributed.Store"
        ) from exc
    return store


def _agree_run_id(store: Store) -> str:
    mine = uuid.uuid4().hex[:12]
    got = store.compare_set("distdebug/run_id", "", mine)
    return got.decode() if isinstance(got, bytes) else str(got)


class Watchdog:
    """One per tracer; a daemon thread so that it never keeps a finished process alive."""

    def __init__(self, tracer: Tracer, store: Store) -> None:
        self.tracer = tracer
        self.config = tracer.config
        try:
            self.run_id = _agree_run_id(store)
        except (RuntimeError, dist.DistStoreError) as exc:
            raise TracerError(
                f"the rendezvous store failed while agreeing on a run id: {exc}"
            ) from exc
        # Each tracing session of a process gets keys of its own, so a report never reads the
        # records an earlier session left in the store. Ranks open the same sequence of
        # sessions (as they make the same sequence of collectives), so the numbers agree.
        self.session = next(_SESSIONS)
        self.prefix = f"distdebug/{self.run_id}/s{self.session}/"
        self.store = PrefixStore(self.prefix, store)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"distdebug-watchdog-rank{tracer.rank}", daemon=True
        )
        self._published_records = False
        self._report_lock = threading.Lock()
        # One store client, used by this thread and (on a failed call) by the caller's thread.
        self._io = threading.RLock()
        self._reported = False
        self._last_hb = 0.0
        self._last_hb_issued = -1
        self.report_path: Path | None = None
        self.report: Any = None  # the analysis.Report when this rank wrote it

    # --- lifecycle ---

    def start(self) -> None:
        self._heartbeat(time.time(), force=True)
        self._thread.start()

    def stop(self, state: RankState = RankState.EXITED) -> None:
        self._stop.set()
        self.tracer.wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
        try:  # ranks still waiting must see where this one went, with its whole ring
            with self._io:
                self.tracer.poll_works()
                dump = self.tracer.dump(state, last=FINAL_RECORDS, reason="tracing stopped")
                self.store.set(f"records/{self.tracer.rank}", dump.dumps())
                self._heartbeat(time.time(), force=True, state=state)
        except (RuntimeError, dist.DistStoreError):
            pass  # the store may be gone at shutdown (its host exited first): nothing to tell

    # --- the loop ---

    def _run(self) -> None:
        cfg = self.config
        tick = cfg.tick
        while not self._stop.is_set():
            self.tracer.wake.wait(tick)
            self.tracer.wake.clear()
            if self._stop.is_set():
                break
            try:
                with self._io:
                    self._tick()
            except (RuntimeError, dist.DistStoreError) as exc:
                # The store went away (its host exited): nothing can be published any more.
                print(
                    f"[distdebug rank {self.tracer.rank}] watchdog stopped: store error: {exc}",
                    file=sys.stderr,
                )
                return

    def _tick(self) -> None:
        now = time.time()
        tracer = self.tracer
        tracer.poll_works()
        self._heartbeat(now)
        if self._reported:
            self._maybe_exit()
            return
        oldest = tracer.oldest_pending()
        if oldest is not None and now - oldest.t_issue >= self.config.stall_s:
            self._trigger(
                f"rank {tracer.rank}: {oldest.op} seq {oldest.seq} not completed after "
                f"{now - oldest.t_issue:.1f} s",
                oldest,
            )
            return
        if self.store.check(["trigger"]):
            self._on_trigger()

    def publish_now(self) -> None:
        """Send the heartbeat (with the newest records) from the caller's thread. If the watchdog
        holds the store for long (it is writing a report), give up after a short wait: the
        heartbeat then goes out on its next tick."""
        if not self._thread.is_alive() or not self._io.acquire(timeout=0.5):
            self.tracer.wake.set()
            return
        try:
            self._heartbeat(time.time(), force=True)
        except (RuntimeError, dist.DistStoreError):
            pass  # the watchdog's own next store call reports a broken store
        finally:
            self._io.release()

    def _heartbeat(
        self, now: float, *, force: bool = False, state: RankState = RankState.ALIVE
    ) -> None:
        issued = self.tracer._issued
        if (
            not force
            and issued == self._last_hb_issued
            and now - self._last_hb < self.config.heartbeat_s
        ):
            return
        dump = self.tracer.dump(state, last=HEARTBEAT_RECORDS, reason="heartbeat")
        self.store.set(f"hb/{self.tracer.rank}", dump.dumps())
        self._last_hb, self._last_hb_issued = now, issued

    # --- reporting ---

    def _trigger(self, reason: str, rec: Record | None) -> None:
        claim = json.dumps({"rank": self.tracer.rank, "reason": reason, "t": time.time()})
        raw = self.store.compare_set("trigger", "", claim)
        got = raw.decode() if isinstance(raw, bytes) else str(raw)
        if not self._published_records:
            self._publish_records(reason)
        if got == claim:
            self._report(reason)
        else:
            self._on_trigger()

    def _on_trigger(self) -> None:
        if not self._published_records:
            self._publish_records("another rank reported a stall")
        if self.store.check(["report"]):
            self._reported = True
            self._maybe_exit()

    def _publish_records(self, reason: str) -> None:
        self.tracer.poll_works()
        dump = self.tracer.dump(RankState.ALIVE, reason=reason)
        self.store.set(f"records/{self.tracer.rank}", dump.dumps())
        self._published_records = True

    def on_error(self, rec: Record) -> None:
        """A traced call raised (a peer died, the group timed out): report now, on the calling
        thread, before the exception ends the process."""
        with self._report_lock:
            if self._reported:
                return
        try:
            with self._io:
                if self.store.check(["report"]):
                    self._reported = True
                    self._maybe_exit()
                    return
                self._trigger(f"rank {self.tracer.rank}: {rec.op} raised {rec.error}", rec)
        except (RuntimeError, dist.DistStoreError) as exc:
            print(
                f"[distdebug rank {self.tracer.rank}] could not report: store error: {exc}",
                file=sys.stderr,
            )

    def _collect(self, t0: float) -> list[RankDump]:
        cfg, world = self.config, self.tracer.world_size
        found: dict[int, RankDump] = {}
        while True:
            now = time.time()
            missing = [r for r in range(world) if r not in found]
            for r in missing:
                if self.store.check([f"records/{r}"]):
                    found[r] = self._read(f"records/{r}")
            missing = [r for r in range(world) if r not in found]
            if not missing:
                break
            stale = {r: self._heartbeat_of(r, now) for r in missing}
            undecided = [r for r, (_, dead) in stale.items() if not dead]
            if now - t0 >= cfg.collect_s and (
                not undecided or now - t0 >= cfg.collect_s + cfg.dead_after_s
            ):
                for r, (hb, dead) in stale.items():
                    if hb is not None:
                        hb.state = RankState.DEAD if dead else RankState.UNKNOWN
                        age = time.time() - hb.published_at
                        hb.reason = (
                            f"no heartbeat for {age:.1f} s"
                            if dead
                            else "alive but published nothing"
                        )
                        found[r] = hb
                break
            time.sleep(min(0.05, cfg.tick))
        return [found[r] for r in sorted(found)]

    def _heartbeat_of(self, rank: int, now: float) -> tuple[RankDump | None, bool]:
        if not self.store.check([f"hb/{rank}"]):
            return None, True
        hb = self._read(f"hb/{rank}")
        dead = hb.state == RankState.EXITED or now - hb.published_at > self.config.dead_after_s
        return hb, dead

    def _read(self, key: str) -> RankDump:
        return parse_dump(self.store.get(key), f"store key {key}")

    def _report(self, reason: str) -> None:
        from reference_impls.distributed_debug.analysis import analyze, format_report

        with self._report_lock:
            if self._reported:
                return
            self._reported = True
        t0 = time.time()
        dumps = self._collect(t0)
        cfg = self.config
        try:
            dumps = check_same_run(dumps)
            report = analyze(dumps, world_size=self.tracer.world_size, reason=reason)
        except RecordsError as exc:
            print(
                f"[distdebug rank {self.tracer.rank}] records could not be merged: {exc}",
                file=sys.stderr,
            )
            self.store.set("report", json.dumps({"error": str(exc)}))
            return
        report.reported_at = time.time()
        text = format_report(report)
        out = cfg.report_dir
        try:
            (out / "records").mkdir(parents=True, exist_ok=True)
            for d in dumps:
                (out / "records" / f"rank{d.rank}.json").write_text(d.dumps())
            (out / "report.json").write_text(json.dumps(report.to_json(), indent=2))
            (out / "report.txt").write_text(text)
            self.report_path = out / "report.txt"
            where = f"\n(written to {self.report_path.resolve()})"
        except OSError as exc:
            where = f"\n(could not write {out}: {exc})"
        self.report = report
        sys.stderr.write(text + where + "\n")
        sys.stderr.flush()
        self.store.set(
            "report",
            json.dumps(
                {"rank": self.tracer.rank, "path": str(self.report_path), "t": report.reported_at}
            ),
        )
        self._maybe_exit()

    def _maybe_exit(self) -> None:
        code = self.config.exit_code_after_report
        if code is None:
            return
        print(
            f"[distdebug rank {self.tracer.rank}] exiting with code {code} after the stall report",
            file=sys.stderr,
        )
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code)
