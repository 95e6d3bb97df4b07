"""Asynchronous SGD with bounded staleness: parameter server, policies, simulator, analysis.

* :mod:`.policies`: one :class:`StalenessPolicy` for bounded staleness (SSP blocking or
  server-side rejection), staleness-aware learning rates (``1/(1+s)``, ``alpha/s``, any
  callable) and momentum correction.
* :mod:`.server`: the transport-free :class:`ParameterServer` both modes share.
* :mod:`.simulator`: a deterministic discrete-event simulator (seeded worker speeds,
  stragglers, stalls, deaths).
* :mod:`.distributed`: the real server and workers over torch.distributed point-to-point
  (gloo), launched with ``torchrun``.
* :mod:`.analysis`: staleness vs loss correlation with a bootstrap interval, and plots.

Command line: ``python -m reference_impls.async_sgd {train,simulate,analyze,bench} --help``.
"""

from reference_impls.async_sgd.policies import (
    AlphaOverS,
    Bound,
    PolicyError,
    StalenessPolicy,
    constant,
    corrected_momentum,
    inverse,
    make_policy,
)
from reference_impls.async_sgd.problem import Problem, ProblemConfig
from reference_impls.async_sgd.server import (
    Death,
    ParameterServer,
    PushError,
    UpdateRecord,
    UpdateStatus,
)
from reference_impls.async_sgd.simulator import (
    SimConfig,
    SimResult,
    WorkerSpeed,
    simulate,
    speed_profile,
)

__all__ = [
    "AlphaOverS",
    "Bound",
    "Death",
    "ParameterServer",
    "PolicyError",
    "Problem",
    "ProblemConfig",
    "PushError",
    "SimConfig",
    "SimResult",
    "StalenessPolicy",
    "UpdateRecord",
    "UpdateStatus",
    "WorkerSpeed",
    "constant",
    "corrected_momentum",
    "inverse",
    "make_policy",
    "simulate",
    "speed_profile",
]
