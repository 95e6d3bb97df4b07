"""The parameter server's logic without a transport: what the simulator and the real server share.

:class:`ParameterServer` holds the flat parameters, the version counter (updates applied so
far), each worker's clock (pushes processed) and the momentum buffer. A push carries the
gradient and the version the worker pulled; the server computes the staleness
``s = version - version_pulled``, asks its :class:`~.policies.StalenessPolicy` whether the
update may be applied and with which learning-rate factor and momentum, applies it and
returns an :class:`UpdateRecord` (also kept in :attr:`ParameterServer.log`).

The update is ``torch.optim.SGD``'s, on one flat tensor (so one worker with ``s = 0``
reproduces ``torch.optim.SGD`` bit for bit)::

    buf = grad                       (first step)        buf = mu * buf + grad   (later)
    params -= lr * lr_factor(s) * (buf if mu else grad)

Bad input changes nothing: a gradient of the wrong shape or dtype, a version from the
future, an unknown or dead worker raise :class:`PushError`; a policy that returns an unusable
factor raises :class:`~.policies.PolicyError`; both before any state is touched.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from reference_impls import atomic
from reference_impls.async_sgd.policies import FLOAT32_MAX, StalenessPolicy

__all__ = [
    "CHECKPOINT_FORMAT",
    "Death",
    "ParameterServer",
    "PushError",
    "UpdateRecord",
    "UpdateStatus",
]

CHECKPOINT_FORMAT = "async_sgd.server/1"


class PushError(ValueError):
    """A push the server cannot use (wrong shape, dtype or version; unknown or dead worker);
    nothing was applied."""


class UpdateStatus(enum.StrEnum):
    """What happened to one pushed gradient. Each push ends in exactly one of these; none
    changes afterwards."""

    APPLIED = "applied"
    REJECTED_STALE = "rejected_stale"
    """Under the REJECT bound, ``s > s_max``: not applied; the worker recomputes."""
    REJECTED_BAD = "rejected_bad"
    """Wrong shape/dtype/version or not finite: not applied; the worker is told why."""
    STOPPED = "stopped"
    """Arrived after the run reached its number of updates: not applied."""


@dataclasses.dataclass(frozen=True)
class UpdateRecord:
    """One line of the staleness log."""

    worker: int
    seq: int
    """The worker's own push counter (0, 1, ...): (worker, seq) names a push uniquely."""
    version_pulled: int
    version: int
    """The server's version after this push was handled (unchanged unless applied)."""
    staleness: int
    lr_factor: float
    momentum: float
    loss: float
    """The worker's minibatch loss at the parameters it pulled."""
    time_s: float
    """When the server handled it (seconds since the run started; simulated time in the
    simulator)."""
    status: UpdateStatus
    server_loss: float | None = None
    """Full-data loss at the server's parameters after the push, when evaluated."""
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        return d


@dataclasses.dataclass(frozen=True)
class Death:
    """A worker the server stopped waiting for."""

    worker: int
    time_s: float
    """When the server declared it dead."""
    version: int
    """The server's version at that moment."""
    last_seq: int
    """Its last push the server handled (-1: none)."""
    reason: str


class ParameterServer:
    """Flat parameters + version + clocks + momentum, updated by pushes in arrival order."""

    def __init__(
        self,
        params: torch.Tensor,
        *,
        lr: float,
        policy: StalenessPolicy,
        workers: Iterable[int],
        staleness_window: int = 64,
    ) -> None:
        if params.dim() != 1 or not params.is_floating_point():
            raise ValueError(
                f"params must be a flat floating-point tensor, got shape {tuple(params.shape)} "
                f"and dtype {params.dtype}"
            )
        if not (math.isfinite(lr) and 0 < lr <= FLOAT32_MAX):
            raise ValueError(
                f"lr must be a finite number > 0, got {lr!r} (at most {FLOAT32_MAX:.4g}: a "
                "float32 step)"
            )
        self.params = params.detach().clone()  # (P,)
        self.lr = float(lr)
        self.policy = policy
        self.version = 0
        self.clocks: dict[int, int] = {int(w): 0 for w in workers}
        if not self.clocks:
            raise ValueError("a parameter server needs at least one worker")
        self.alive: set[int] = set(self.clocks)
        self.momentum_buf: torch.Tensor | None = None  # (P,) once momentum was used
        self.counts: collections.Counter[str] = collections.Counter()
        self.log: list[UpdateRecord] = []
        self.deaths: list[Death] = []
        self.last_seq: dict[int, int] = dict.fromkeys(self.clocks, -1)
        self._recent_s: collections.deque[int] = collections.deque(maxlen=staleness_window)

    # -- pulls and the SSP gate ------------------------------------------------------------
    def snapshot(self) -> tuple[torch.Tensor, int]:
        """(copy of the parameters, version): what a pull returns."""
        return self.params.clone(), self.version

    def slowest_clock(self) -> int:
        return min(self.clocks[w] for w in self.alive) if self.alive else 0

    def may_start(self, worker: int) -> bool:
        """Whether ``worker`` may begin its next step now (the SSP gate; dead workers do not
        hold the others back)."""
        return self.policy.may_start(self.clocks[worker], self.slowest_clock())

    def mark_dead(self, worker: int, time_s: float, reason: str) -> Death | None:
        """Stop waiting for ``worker``; None if it was already dead."""
        if worker not in self.alive:
            return None
        self.alive.discard(worker)
        death = Death(worker, time_s, self.version, self.last_seq[worker], reason)
        self.deaths.append(death)
        return death

    # -- pushes ----------------------------------------------------------------------------
    def check_push(self, worker: int, grad: torch.Tensor, version_pulled: int) -> None:
        """Raise :class:`PushError` for a push that cannot be applied (state untouched)."""
        if worker not in self.clocks:
            raise PushError(f"unknown worker {worker}; the server knows {sorted(self.clocks)}")
        if worker not in self.alive:
            raise PushError(f"worker {worker} was declared dead; its pushes are not applied")
        if grad.shape != self.params.shape:
            raise PushError(
                f"worker {worker} pushed a gradient of shape {tuple(grad.shape)}; the "
                f"parameters have shape {tuple(self.params.shape)}: push the flat gradient "
                "of every parameter"
            )
        if grad.dtype != self.params.dtype:
            raise PushError(
                f"worker {worker} pushed a {grad.dtype} gradient; the parameters are "
                f"{self.params.dtype}"
            )
        if not 0 <= version_pulled <= self.version:
            raise PushError(
                f"worker {worker} pushed a gradient of version {version_pulled}; the server is "
                f"at version {self.version} (a version must be one the server handed out)"
            )

    def push(
        self,
        worker: int,
        grad: torch.Tensor,
        version_pulled: int,
        *,
        seq: int,
        loss: float,
        time_s: float,
        stopped: bool = False,
    ) -> UpdateRecord:
        """Handle one push; apply it unless the policy rejects it or ``stopped``.

        Raises:
            PushError: bad push (nothing applied, clock unchanged).
            PolicyError: the policy's factor is negative or not finite (nothing applied).
        """
        self.check_push(worker, grad, version_pulled)
        s = self.version - version_pulled
        if stopped:
            return self._record(
                worker, seq, version_pulled, s, 0.0, 0.0, loss, time_s, UpdateStatus.STOPPED
            )
        if not self.policy.admits(s):
            self.clocks[worker] += 1
            return self._record(
                worker,
                seq,
                version_pulled,
                s,
                0.0,
                0.0,
                loss,
                time_s,
                UpdateStatus.REJECTED_STALE,
                detail=f"s={s} > s_max={self.policy.s_max}",
            )
        if not torch.isfinite(grad).all():
            raise PushError(f"worker {worker} pushed a gradient with NaN or inf entries")
        factor = self.policy.factor(s)  # raises before anything changes
        mean_s = (sum(self._recent_s) + s) / (len(self._recent_s) + 1)
        mu = self.policy.explicit_momentum(mean_s)
        if mu != 0.0:
            if self.momentum_buf is None:
                self.momentum_buf = grad.detach().clone()
            else:
                self.momentum_buf.mul_(mu).add_(grad)
            step = self.momentum_buf
        else:
            step = grad
        self.params.add_(step, alpha=-(self.lr * factor))
        self.version += 1
        self.clocks[worker] += 1
        self._recent_s.append(s)
        return self._record(
            worker, seq, version_pulled, s, factor, mu, loss, time_s, UpdateStatus.APPLIED
        )

    def reject_bad(
        self, worker: int, seq: int, version_pulled: int, *, loss: float, time_s: float, detail: str
    ) -> UpdateRecord:
        """Log a push that could not be used (:class:`PushError`) without changing anything
        but the worker's clock (it did one step of work)."""
        if worker in self.clocks:
            self.clocks[worker] += 1
        s = self.version - version_pulled if 0 <= version_pulled <= self.version else -1
        return self._record(
            worker,
            seq,
            version_pulled,
            s,
            0.0,
            0.0,
            loss,
            time_s,
            UpdateStatus.REJECTED_BAD,
            detail=detail,
        )

    def _record(
        self,
        worker: int,
        seq: int,
        version_pulled: int,
        s: int,
        factor: float,
        mu: float,
        loss: float,
        time_s: float,
        status: UpdateStatus,
        detail: str = "",
    ) -> UpdateRecord:
        rec = UpdateRecord(
            worker=worker,
            seq=seq,
            version_pulled=version_pulled,
            version=self.version,
            staleness=s,
            lr_factor=factor,
            momentum=mu,
            loss=float(loss),
            time_s=float(time_s),
            status=status,
            detail=detail,
        )
        self.counts[status.value] += 1
        if worker in self.last_seq:
            self.last_seq[worker] = max(self.last_seq[worker], seq)
        self.log.append(rec)
        return rec

    def set_server_loss(self, loss: float) -> None:
        """Attach the full-data loss after the last handled push to its record."""
        self.log[-1] = dataclasses.replace(self.log[-1], server_loss=float(loss))

    # -- checkpoints -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds: parameters, momentum buffer, version, clocks, counts,
        last handled push per worker, recent staleness (momentum correction), lr, policy."""
        return {
            "format": CHECKPOINT_FORMAT,
            "params": self.params.clone(),
            "momentum_buf": None if self.momentum_buf is None else self.momentum_buf.clone(),
            "version": self.version,
            "clocks": dict(self.clocks),
            "counts": dict(self.counts),
            "last_seq": dict(self.last_seq),
            "recent_staleness": list(self._recent_s),
            "lr": self.lr,
            "policy": self.policy.describe(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the parameter count and the workers must match."""
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(
                f"not a parameter-server checkpoint (format {state.get('format')!r}, expected "
                f"{CHECKPOINT_FORMAT!r})"
            )
        params = state["params"]
        if params.shape != self.params.shape or params.dtype != self.params.dtype:
            raise ValueError(
                f"checkpoint parameters are {tuple(params.shape)} {params.dtype}; this model has "
                f"{tuple(self.params.shape)} {self.params.dtype}: resume with the same problem"
            )
        clocks = {int(k): int(v) for k, v in state["clocks"].items()}
        if set(clocks) != set(self.clocks):
            raise ValueError(
                f"checkpoint was written with workers {sorted(clocks)}; this run has "
                f"{sorted(self.clocks)}: resume with the same number of workers"
            )
        self.params.copy_(params)
        buf = state["momentum_buf"]
        self.momentum_buf = None if buf is None else buf.clone()
        self.version = int(state["version"])
        self.clocks = clocks
        self.counts = collections.Counter(state["counts"])
        self.last_seq = {int(k): int(v) for k, v in state["last_seq"].items()}
        self._recent_s.clear()
        self._recent_s.extend(int(s) for s in state["recent_staleness"])

    def save(self, path: str | Path) -> Path:
        """Write :meth:`state_dict` atomically and durably: a restarted server resumes from
        it, so once this returns it survives a crash of the machine too."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic.replacing(path, durable=True) as tmp:
            torch.save(self.state_dict(), tmp)
        return path

    def load(self, path: str | Path) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint at {path}: check the --resume path")
        self.load_state_dict(torch.load(path, weights_only=True))
