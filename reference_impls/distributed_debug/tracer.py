"""The collective tracer: every ``torch.distributed`` collective and P2P call, recorded per rank.

::

    with trace_collectives(config=TraceConfig(stall_s=5)):
        train()          # a stall of 5 s prints a report naming the first divergence

    install()            # or for the whole process (uninstall() to stop)

How: the public functions of ``torch.distributed`` (and the same names in
``torch.distributed.distributed_c10d``, which torch's own helpers such as
``all_gather_object`` call) are replaced once by thin wrappers. While no tracer is active a
wrapper only forwards (one global read). While one is, it records a :class:`Record` (sequence
number per group, op, the shapes and dtypes every rank must agree on, reduce op, root or peer,
the caller's file:line:function, issue and completion times) into a bounded ring, then calls
the original. A call made by a traced call (``batch_isend_irecv`` calling ``isend``) is not
recorded twice. Completion: a blocking call completes when it returns; an async one (and any
call on CUDA tensors, which returns before the GPU is done) when its ``Work`` reports
completed, polled by the watchdog. DDP's gradient buckets are reduced in C++ without these
functions: :func:`register_ddp_hook` records them through a comm hook.

Only calls looked up through the module at call time are seen: a name bound before
:func:`install` (``from torch.distributed import all_reduce``) keeps the original.

Over 500 lines, one concern: the :class:`Tracer`'s recording and completion logic and the
wrappers that feed it; what each op's arguments mean is in opargs.py.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import inspect
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import Store

from reference_impls import atomic
from reference_impls.distributed_debug.config import TraceConfig, TracerError
from reference_impls.distributed_debug.opargs import (
    CANONICAL,
    EXTRACT,
    P2P,
    TRACED_OPS,
    by_name,
    dtype_name,
    global_rank,
    tensors,
)
from reference_impls.distributed_debug.records import CallSite, RankDump, RankState, Record

__all__ = [
    "TRACED_OPS",
    "Tracer",
    "active_tracer",
    "install",
    "register_ddp_hook",
    "trace_collectives",
    "uninstall",
]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# Files of this package that are plumbing, not user code (the demo's scenarios are user code).
_OWN_FILES = {
    os.path.join(_OWN_DIR, f) for f in ("tracer.py", "opargs.py", "watchdog.py", "guards.py")
}

_ACTIVE: Tracer | None = None
_LOCAL = threading.local()  # .busy: a traced call is running on this thread
_ORIGINALS: dict[str, Callable[..., Any]] = {}
_WRAPPERS: dict[str, Callable[..., Any]] = {}
_INSTALL_LOCK = threading.Lock()


def active_tracer() -> Tracer | None:
    """The tracer recording now in this process, if any."""
    return _ACTIVE


class _GroupInfo:
    __slots__ = ("group_rank", "name", "ranks")

    def __init__(self, name: str, ranks: list[int], group_rank: int) -> None:
        self.name = name
        self.ranks = ranks
        self.group_rank = group_rank


class Tracer:
    """Records of one rank, and the watchdog that reports stalls. Use :func:`trace_collectives`
    or :func:`install`; one tracer is active per process."""

    def __init__(
        self,
        config: TraceConfig | None = None,
        *,
        group: dist.ProcessGroup | None = None,
        store: Store | None = None,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise TracerError(
                "torch.distributed is not initialized: call dist.init_process_group(...) "
                "before trace_collectives()/install() (the tracer needs the rank, the world "
                "size and the job's rendezvous store)"
            )
        self.config = config or TraceConfig()
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.only_group = None if group is None else self._group_name(group)
        self._ring: collections.deque[Record] = collections.deque(maxlen=self.config.ring_size)
        self._issued = 0
        # The ring is appended to by the calling thread and copied by the watchdog: both are
        # single C-level deque operations under the GIL, so no lock on the hot path. Async
        # calls (rare) are tracked in a side list the watchdog polls.
        self._lock = threading.Lock()
        self._async: list[Record] = []
        self._seq: dict[str, int] = {}
        self._p2p_seq: dict[tuple[str, int, str, int], int] = {}
        self._groups: dict[int, _GroupInfo | None] = {}
        self._group_table: dict[str, list[int]] = {}
        self._internal: dict[CodeType, bool] = {}
        self._seen: set[tuple[CallSite, tuple[Any, ...]]] = set()
        self.host = socket.gethostname()
        self._stopped = False
        self.wake = threading.Event()  # stops the watchdog's wait early (stop, busy store)
        from reference_impls.distributed_debug.watchdog import Watchdog, open_store

        self.store = open_store(store, self.config.store_timeout_s)
        self.watchdog = Watchdog(self, self.store)

    # --- groups ---

    @staticmethod
    def _group_name(pg: dist.ProcessGroup) -> str:
        return str(pg.group_name)

    def _info(self, group: Any) -> _GroupInfo | None:
        key = id(group)
        info = self._groups.get(key, False)
        if info is not False:
            return info  # type: ignore[return-value]
        pg = group if group is not None else c10d._get_default_group()
        name = self._group_name(pg)
        ranks = dist.get_process_group_ranks(pg)
        if self.rank not in ranks or (self.only_group is not None and name != self.only_group):
            result = None  # torch does nothing for a non-member; a filtered group is not traced
        else:
            result = _GroupInfo(name, ranks, ranks.index(self.rank))
            self._group_table[name] = ranks
        self._groups[key] = result
        return result

    # --- call sites ---

    def callsite(self, depth: int = 2) -> CallSite:
        """The first frame outside torch and outside this tracer (cached per code object)."""
        f = sys._getframe(depth)
        internal = self._internal
        while f is not None:
            code = f.f_code
            flag = internal.get(code)
            if flag is None:
                fn = code.co_filename
                flag = internal[code] = fn.startswith(_TORCH_DIR) or fn in _OWN_FILES
            if not flag:
                return (code.co_filename, f.f_lineno, code.co_name)
            f = f.f_back  # type: ignore[assignment]
        return ("<unknown>", 0, "?")

    # --- recording ---

    def _add(self, rec: Record) -> None:
        self._ring.append(rec)
        self._issued += 1
        novel = (rec.callsite, rec.signature())
        if novel not in self._seen and len(self._seen) < self.config.publish_novel_calls:
            # A call this rank has not made before (new line or new arguments) is published
            # before it is issued: the calls that break jobs are the novel ones, and gloo may
            # abort the process within milliseconds of a size mismatch, faster than the
            # watchdog's next heartbeat. Steady-state loops repeat known calls: no cost there.
            self._seen.add(novel)
            self.watchdog.publish_now()

    def _track(self, rec: Record, work: Any) -> None:
        rec.work = work
        with self._lock:
            self._async.append(rec)
            if len(self._async) > self.config.ring_size:
                # Thousands of queued GPU calls between two ticks: settle the oldest here so
                # the list (and the Works it holds) stays bounded by the ring size.
                oldest = self._async.pop(0)
                if oldest.work is not None and oldest.work.is_completed():
                    self._done(oldest, time.time())
                elif oldest.work is not None:
                    self._async.insert(0, oldest)

    def _done(self, rec: Record, t: float) -> None:
        rec.t_done = t
        rec.work = None

    def _fail(self, rec: Record, exc: BaseException) -> None:
        rec.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        rec.work = None
        self.watchdog.on_error(rec)

    def _bind(
        self, names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], _GroupInfo | None]:
        """The prologue of a traced collective or point-to-point call: its arguments by name
        and the traced group it runs on (None: not a member, or filtered out: call through)."""
        a = by_name(names, args, kwargs)
        return a, self._info(a.get("group"))

    def _collective(
        self,
        name: str,
        orig: Callable[..., Any],
        names: tuple[str, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        a, info = self._bind(names, args, kwargs)
        if info is None:
            return orig(*args, **kwargs)
        shapes, dtypes, reduce_op, root_key = EXTRACT[name](a)
        root = None if root_key is None else global_rank(a, info.ranks, root_key)
        seq = self._seq.get(info.name, 0)
        self._seq[info.name] = seq + 1
        rec = Record(
            seq=seq,
            op=CANONICAL.get(name, name),
            group=info.name,
            shapes=shapes,
            dtypes=dtypes,
            reduce_op=reduce_op,
            peer=root,
            callsite=self.callsite(3),
            t_issue=time.time(),
        )
        self._add(rec)
        async_op = bool(a.get("async_op", False))
        first = a.get("tensor", a.get("input", a.get("input_tensor")))
        on_gpu = isinstance(first, torch.Tensor) and first.is_cuda
        if on_gpu and not async_op and "async_op" in names:
            # A blocking call on CUDA tensors returns once it is queued, not done: call it
            # async (torch's blocking path is exactly async + wait()) and keep the Work.
            at = names.index("async_op")
            if len(args) > at:  # passed positionally
                args = (*args[:at], True, *args[at + 1 :])
            else:
                kwargs = {**kwargs, "async_op": True}
        _LOCAL.busy = True
        try:
            work = orig(*args, **kwargs)
        except BaseException as exc:
            self._fail(rec, exc)
            raise
        finally:
            _LOCAL.busy = False
        if on_gpu and not async_op and "async_op" in names:
            if work is not None:
                work.wait()
                self._track(rec, work)
            else:
                self._done(rec, time.time())
            return None
        if async_op and work is not None:
            self._track(rec, work)
        else:
            self._done(rec, time.time())
        return work

    def _p2p_record(
        self, op: str, info: _GroupInfo, peer: int | None, tensor: Any, tag: int, site: CallSite
    ) -> Record:
        direction = "send" if op in ("send", "isend") else "recv"
        key = (info.name, -1 if peer is None else peer, direction, tag)
        seq = self._p2p_seq.get(key, 0)
        self._p2p_seq[key] = seq + 1
        shapes, dtypes = tensors(tensor)
        return Record(
            seq=seq,
            op=op,
            group=info.name,
            shapes=shapes,
            dtypes=dtypes,
            reduce_op=None,
            peer=peer,
            callsite=site,
            t_issue=time.time(),
            p2p=True,
            tag=tag,
        )

    def _p2p(
        self,
        name: str,
        orig: Callable[..., Any],
        names: tuple[str, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        a, info = self._bind(names, args, kwargs)
        if info is None:
            return orig(*args, **kwargs)
        peer = global_rank(a, info.ranks, "dst" if name in ("send", "isend") else "src")
        rec = self._p2p_record(
            name, info, peer, a.get("tensor"), int(a.get("tag") or 0), self.callsite(3)
        )
        self._add(rec)
        _LOCAL.busy = True
        try:
            result = orig(*args, **kwargs)
        except BaseException as exc:
            self._fail(rec, exc)
            raise
        finally:
            _LOCAL.busy = False
        if name in ("isend", "irecv") and result is not None:
            self._track(rec, result)
        else:
            self._done(rec, time.time())
        return result

    def _batch(
        self,
        orig: Callable[..., Any],
        names: tuple[str, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        a = by_name(names, args, kwargs)
        ops = a.get("p2p_op_list")
        if not isinstance(ops, list) or not ops:
            return orig(*args, **kwargs)  # torch raises its own error
        info = self._info(ops[0].group)
        if info is None:
            return orig(*args, **kwargs)
        site = self.callsite(3)
        recs = []
        for p in ops:
            # torch tells a send from a receive by identity with its module's isend: a P2POp
            # built before install() holds the original function, one built after the wrapper.
            is_send = p.op in (_ORIGINALS.get("isend"), _WRAPPERS.get("isend"))
            p.op = c10d.isend if is_send else c10d.irecv
            recs.append(
                self._p2p_record(
                    "isend" if is_send else "irecv", info, p.peer, p.tensor, p.tag, site
                )
            )
        for rec in recs:
            self._add(rec)
        _LOCAL.busy = True
        try:
            works = orig(*args, **kwargs)
        except BaseException as exc:
            for rec in recs:
                self._fail(rec, exc)
            raise
        finally:
            _LOCAL.busy = False
        if works and len(works) == len(recs):
            for rec, work in zip(recs, works, strict=True):
                self._track(rec, work)
        elif works:  # coalesced backends (NCCL) return one Work for the whole batch
            for rec in recs:
                self._track(rec, works[-1])
        else:
            for rec in recs:
                self._done(rec, time.time())
        return works

    def record_external(
        self,
        op: str,
        group: Any,
        shapes: tuple[tuple[int, ...], ...],
        dtypes: tuple[str, ...],
        reduce_op: str | None,
        site: CallSite,
    ) -> Record | None:
        """Record a collective issued outside ``torch.distributed``'s Python functions (DDP's
        buckets); the caller marks it done with :meth:`complete`."""
        info = self._info(group)
        if info is None:
            return None
        seq = self._seq.get(info.name, 0)
        self._seq[info.name] = seq + 1
        rec = Record(
            seq=seq,
            op=op,
            group=info.name,
            shapes=shapes,
            dtypes=dtypes,
            reduce_op=reduce_op,
            peer=None,
            callsite=site,
            t_issue=time.time(),
        )
        self._add(rec)
        return rec

    def complete(self, rec: Record) -> None:
        self._done(rec, time.time())

    # --- reading ---

    def poll_works(self) -> None:
        """Mark async calls whose Work finished as done (called by the watchdog)."""
        with self._lock:
            waiting, self._async = self._async, []
        now = time.time()
        still = []
        for rec in waiting:
            work = rec.work
            if work is None:
                continue
            try:
                finished = work.is_completed()
            except RuntimeError as exc:  # a failed Work raises from is_completed on some backends
                rec.error = f"{type(exc).__name__}: {str(exc)[:300]}"
                finished = True
            if finished:
                self._done(rec, now)
            else:
                still.append(rec)
        with self._lock:
            self._async[:0] = still

    def snapshot(self, last: int | None = None) -> tuple[list[Record], int]:
        """(records oldest first, how many fell out of the ring before them)."""
        issued = self._issued
        records = list(self._ring)  # one C-level copy: atomic under the GIL
        if last is not None:
            records = records[-last:]
        return records, max(0, issued - len(records))

    def oldest_pending(self) -> Record | None:
        for rec in list(self._ring):  # issue order: the first pending one is the oldest
            if rec.t_done is None and rec.error is None:
                return rec
        return None

    def dump(
        self, state: RankState = RankState.ALIVE, *, last: int | None = None, reason: str = ""
    ) -> RankDump:
        records, dropped = self.snapshot(last)
        return RankDump(
            run_id=self.watchdog.run_id,
            rank=self.rank,
            world_size=self.world_size,
            state=state,
            published_at=time.time(),
            groups=dict(self._group_table),
            records=records,
            dropped=dropped,
            pid=os.getpid(),
            host=self.host,
            reason=reason,
        )

    def dump_to(self, directory: str | os.PathLike[str]) -> Path:
        """Write this rank's records to ``directory/rank{rank}.json`` (for offline analysis)."""
        path = Path(directory) / f"rank{self.rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        # Not durable: a dump is for offline analysis of this run, not state to resume from.
        atomic.write_text(path, self.dump(reason="dump").dumps(), durable=False)
        return path

    # --- lifecycle ---

    def start(self) -> None:
        global _ACTIVE
        with _INSTALL_LOCK:
            if _ACTIVE is not None:
                raise TracerError(
                    f"a tracer is already active in this process (rank {_ACTIVE.rank}); "
                    "nest nothing: call uninstall() or leave its trace_collectives() first"
                )
            _patch()
            self.watchdog.start()
            _ACTIVE = self
        # A process that ends while still installed (install() without uninstall()) still
        # tells the ranks waiting for it that it exited, with its whole ring.
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop recording; publish the full ring (state EXITED) so ranks still waiting can see
        where this one went. Idempotent."""
        global _ACTIVE
        with _INSTALL_LOCK:
            if _ACTIVE is self:
                _ACTIVE = None
            if self._stopped:
                return
            self._stopped = True
        atexit.unregister(self.stop)
        self.watchdog.stop(state=RankState.EXITED)


# --- patching -------------------------------------------------------------------------------


def _make_wrapper(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    names = tuple(inspect.signature(orig).parameters)
    if name == "batch_isend_irecv":

        def call(tracer: Tracer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return tracer._batch(orig, names, args, kwargs)
    elif name in P2P:

        def call(tracer: Tracer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return tracer._p2p(name, orig, names, args, kwargs)
    else:

        def call(tracer: Tracer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return tracer._collective(name, orig, names, args, kwargs)

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        tracer = _ACTIVE
        if tracer is None or getattr(_LOCAL, "busy", False):
            return orig(*args, **kwargs)
        return call(tracer, args, kwargs)

    wrapper.__distdebug_original__ = orig  # type: ignore[attr-defined]
    return wrapper


def _patch() -> None:
    """Replace the functions once per process; they forward untouched while no tracer is active."""
    if _WRAPPERS:
        return
    for name in TRACED_OPS:
        orig = getattr(c10d, name, None)
        if orig is None:
            continue
        _ORIGINALS[name] = orig
        _WRAPPERS[name] = _make_wrapper(name, orig)
    for name, wrapper in _WRAPPERS.items():
        setattr(c10d, name, wrapper)
        if getattr(dist, name, None) is _ORIGINALS[name]:
            setattr(dist, name, wrapper)


def _unpatch() -> None:
    for name, orig in _ORIGINALS.items():
        if getattr(c10d, name, None) is _WRAPPERS[name]:
            setattr(c10d, name, orig)
        if getattr(dist, name, None) is _WRAPPERS[name]:
            setattr(dist, name, orig)
    _WRAPPERS.clear()
    _ORIGINALS.clear()


def install(
    config: TraceConfig | None = None,
    *,
    group: dist.ProcessGroup | None = None,
    store: Store | None = None,
) -> Tracer:
    """Trace every collective of this process from now on (until :func:`uninstall`).

    Call it on every rank after ``init_process_group``. ``group``: trace only that process
    group (default: all). ``store``: where to publish (default: a new client of the job's
    rendezvous store).
    """
    tracer = Tracer(config, group=group, store=store)
    tracer.start()
    return tracer


def uninstall(*, restore_functions: bool = False) -> None:
    """Stop the active tracer. ``restore_functions``: also put torch's original functions back
    (P2POps built with ``dist.isend`` while installed then no longer pass torch's own check)."""
    tracer = _ACTIVE
    if tracer is not None:
        tracer.stop()
    if restore_functions:
        with _INSTALL_LOCK:
            _unpatch()


@contextlib.contextmanager
def trace_collectives(
    group: dist.ProcessGroup | None = None,
    *,
    config: TraceConfig | None = None,
    store: Store | None = None,
) -> Iterator[Tracer]:
    """Trace the collectives issued inside the block (see :func:`install`)."""
    tracer = install(config, group=group, store=store)
    try:
        yield tracer
    finally:
        tracer.stop()


# --- DDP ------------------------------------------------------------------------------------


def register_ddp_hook(model: torch.nn.parallel.DistributedDataParallel) -> None:
    """Record DDP's gradient-bucket all-reduces (which DDP issues in C++, past the wrappers).

    Installs a comm hook equivalent to DDP's default (divide by the world size, all-reduce
    sum); call before the first backward. The call site of a bucket is the user's
    ``backward()`` line when the hook runs on the caller's thread, else ``DDP bucket i``.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    group = model.process_group

    # No annotations: DDP compares them with dist.GradBucket, and this module defers them.
    def hook(state, bucket):
        tracer = _ACTIVE
        if tracer is None:
            return default_hooks.allreduce_hook(group, bucket)
        buffer = bucket.buffer()
        site = tracer.callsite(2)
        if site[0] == "<unknown>":
            site = ("DDP", bucket.index(), "gradient bucket")
        rec = tracer.record_external(
            "ddp_bucket_all_reduce",
            group,
            (tuple(buffer.shape),),
            (dtype_name(buffer),),
            "sum",
            site,
        )
        _LOCAL.busy = True
        try:
            fut = default_hooks.allreduce_hook(group, bucket)
        except BaseException as exc:
            if rec is not None:
                tracer._fail(rec, exc)
            raise
        finally:
            _LOCAL.busy = False
        if rec is None:
            return fut

        def finished(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            tracer.complete(rec)
            return f.value()

        return fut.then(finished)

    model.register_comm_hook(None, hook)
