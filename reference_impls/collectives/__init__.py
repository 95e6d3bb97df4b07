"""Ring all-reduce: an exact NumPy simulation and a real ring on torch.distributed.

* :func:`simulate_ring_allreduce` (NumPy, no processes): the two phases on one array per
  worker, with an optional message log; :func:`ring_cost` is the cost model it obeys.
* :func:`ring_all_reduce` (torch.distributed ``batch_isend_irecv``, gloo and NCCL): in place,
  any world size, uneven sizes, pipelined segments, a cross-rank metadata check and finite
  timeouts. Launch it with ``torchrun``; :func:`launch` starts gloo (or NCCL) processes on one
  machine for tests and benchmarks.
* ``python -m reference_impls.collectives`` checks the ring against ``dist.all_reduce``
  (under ``torchrun``, or spawning gloo processes itself); ``python -m
  reference_impls.collectives.bench`` measures bus bandwidth against ``dist.all_reduce``.
"""

from reference_impls.collectives.launcher import LaunchConfig, LaunchError, RankFailure, launch
from reference_impls.collectives.ring import (
    DTYPES,
    RingConfig,
    RingGraph,
    RingMismatchError,
    RingPeerError,
    ring_all_reduce,
)
from reference_impls.collectives.schedule import (
    RING_SCHEDULE,
    RingCost,
    RingSchedule,
    bus_bandwidth_factor,
    chunk_bounds,
    ring_cost,
)
from reference_impls.collectives.simulation import Message, simulate_ring_allreduce

__all__ = [
    "DTYPES",
    "RING_SCHEDULE",
    "LaunchConfig",
    "LaunchError",
    "Message",
    "RankFailure",
    "RingConfig",
    "RingCost",
    "RingGraph",
    "RingMismatchError",
    "RingPeerError",
    "RingSchedule",
    "bus_bandwidth_factor",
    "chunk_bounds",
    "launch",
    "ring_all_reduce",
    "ring_cost",
    "simulate_ring_allreduce",
]
