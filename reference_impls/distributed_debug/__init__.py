"""Distributed hang and desync debugging: a collective tracer that names the first divergence.

* :func:`trace_collectives` / :func:`install`: record every ``torch.distributed`` collective
  and P2P call (and DDP's buckets via :func:`register_ddp_hook`) per rank in a bounded ring:
  sequence number, op, shapes, dtypes, reduce op, peer, the caller's file:line, times.
* A watchdog thread per rank: a call pending past ``TraceConfig.stall_s`` (or one that raised)
  makes every rank publish its records through the job's rendezvous store; one rank merges
  them and writes the report (stderr and ``report_dir``), long before the group timeout.
  Dead ranks are named with their last record.
* :func:`analyze` / ``python -m reference_impls.distributed_debug analyze DIR``: the first
  divergence, classified (a) op mismatch, (b) argument mismatch, (c) skipped/extra call,
  (d) stuck/straggler, (e) dead rank, (f) unmatched P2P.
* Guards: :func:`check_equal_steps`, :class:`PaddedEvenSampler`, :class:`JoinableAllReduce`.
* Demo: ``torchrun --nproc-per-node 4 -m reference_impls.distributed_debug demo --scenario seed``.
"""

from reference_impls.distributed_debug.analysis import Finding, Kind, Report, analyze, format_report
from reference_impls.distributed_debug.config import DEFAULT_RING_SIZE, TraceConfig, TracerError
from reference_impls.distributed_debug.guards import (
    JoinableAllReduce,
    PaddedEvenSampler,
    UnevenStepsError,
    check_equal_steps,
)
from reference_impls.distributed_debug.records import (
    RankDump,
    RankState,
    Record,
    RecordsError,
    RecordStatus,
    load_dumps,
)
from reference_impls.distributed_debug.tracer import (
    Tracer,
    active_tracer,
    install,
    register_ddp_hook,
    trace_collectives,
    uninstall,
)

__all__ = [
    "DEFAULT_RING_SIZE",
    "Finding",
    "JoinableAllReduce",
    "Kind",
    "PaddedEvenSampler",
    "RankDump",
    "RankState",
    "Record",
    "RecordStatus",
    "RecordsError",
    "Report",
    "TraceConfig",
    "Tracer",
    "TracerError",
    "UnevenStepsError",
    "active_tracer",
    "analyze",
    "check_equal_steps",
    "format_report",
    "install",
    "load_dumps",
    "register_ddp_hook",
    "trace_collectives",
    "uninstall",
]
