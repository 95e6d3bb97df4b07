"""Staleness policies: one interface for bounded staleness, learning-rate damping and momentum.

Under asynchronous SGD a worker's gradient was computed at parameters ``s`` updates old, where
the *staleness* ``s = server version at apply - version the worker pulled``. The bias of such
a step grows with ``s`` and with the step size, so a policy decides, per update:

* **whether it may be applied or must wait** (bounded staleness), two named variants:

  - :attr:`Bound.SSP`, stale synchronous parallel (Ho et al. 2013, "More effective
    distributed ML via a stale synchronous parallel parameter server"): a worker whose clock
    (updates it has pushed) is more than ``s_max`` ahead of the slowest live worker's blocks
    before its next step, until the slowest catches up. It bounds the *clock spread*, not
    ``s`` itself: with N workers each other worker can push at most ``2 s_max + 1`` updates
    while one worker computes, so ``s <= (N - 1)(2 s_max + 1)``
    (:meth:`StalenessPolicy.max_staleness`).
  - :attr:`Bound.REJECT`: the server refuses an update with ``s > s_max``; nothing is applied
    and the worker recomputes on the fresh parameters it gets back. Bounds ``s <= s_max``
    exactly, at the cost of wasted gradients.

* **how large a step it takes**: the nominal learning rate times ``lr_factor(s)``. Built in:
  :func:`inverse` ``1 / (1 + s)`` (the default: ``s = 1`` halves the step, ``s = 10`` takes
  1/11, about 9%), :class:`AlphaOverS` ``alpha / s`` (Zhang et al. 2016, "Staleness-aware
  async-SGD for distributed deep learning"; ``s = 0`` takes the nominal step), :func:`constant`
  (no damping), or any callable ``int -> float``. A factor that is negative or not finite is an
  error (:class:`PolicyError`), raised before anything is applied.

* **how much explicit momentum** to use (Mitliagkas et al. 2016, "Asynchrony begets momentum,
  with an application to deep learning"): with N workers whose updates arrive in random order,
  asynchrony itself adds an *implicit* momentum of about ``1 - 1/N``. Momentum correction
  keeps the total near the momentum ``mu`` one would use synchronously::

      mu_explicit = max(mu_floor, mu - (1 - 1 / N_eff)),   N_eff = 1 + mean staleness

  where ``N_eff`` is estimated from the staleness actually observed (in a round-robin steady
  state with N busy workers the mean staleness is N - 1, so N_eff = N); ``mu_floor`` is 0 by
  default (the paper also reports cases where a negative explicit momentum is best: pass a
  negative floor to allow it).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
from collections.abc import Callable, Mapping

FLOAT32_MAX = 3.4028234663852886e38
"""The largest step size or factor the float32 parameters can take: torch refuses to convert a
larger Python float into a float32 ``alpha`` (a RuntimeError mid-run, not a refusal)."""

__all__ = [
    "LR_FACTORS",
    "AlphaOverS",
    "Bound",
    "PolicyError",
    "StalenessPolicy",
    "constant",
    "corrected_momentum",
    "inverse",
    "make_policy",
]


class PolicyError(ValueError):
    """A policy is misconfigured or returned an unusable value; nothing was applied."""


class Bound(enum.StrEnum):
    """How staleness is bounded (written to the run's JSON as its value)."""

    NONE = "none"
    """No bound: every update is applied whatever its staleness."""
    SSP = "ssp"
    """Stale synchronous parallel: a worker more than ``s_max`` clocks ahead of the slowest
    live worker blocks before its next step."""
    REJECT = "reject"
    """The server rejects (does not apply) an update with ``s > s_max``; the worker recomputes
    on fresh parameters."""


def inverse(s: int) -> float:
    """``1 / (1 + s)``: the nominal step for a fresh gradient, half at ``s = 1``, 1/11 at 10."""
    return 1.0 / (1.0 + s)


def constant(s: int) -> float:
    """1 at every staleness: plain asynchronous SGD, no damping."""
    return 1.0


@dataclasses.dataclass(frozen=True)
class AlphaOverS:
    """``alpha / s`` for ``s >= 1`` and 1 for a fresh gradient (Zhang et al. 2016 divide the
    learning rate by the staleness; at ``s = 0`` there is nothing to divide by)."""

    alpha: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.alpha) and 0 < self.alpha <= FLOAT32_MAX):
            raise PolicyError(
                f"alpha must be a finite number > 0, got {self.alpha!r} (at most "
                f"{FLOAT32_MAX:.4g}: a float32 step factor)"
            )

    def __call__(self, s: int) -> float:
        return 1.0 if s == 0 else self.alpha / s


LR_FACTORS: Mapping[str, Callable[[int], float]] = {
    "inverse": inverse,
    "alpha-over-s": AlphaOverS(),
    "constant": constant,
}
"""The learning-rate policies the command line knows by name."""


def corrected_momentum(mu: float, n_eff: float, floor: float = 0.0) -> float:
    """Explicit momentum that keeps explicit + implicit near ``mu`` (Mitliagkas et al. 2016).

    ``mu_explicit = max(floor, mu - (1 - 1 / n_eff))``: asynchrony over ``n_eff`` workers adds
    an implicit momentum of ``1 - 1 / n_eff``; one worker (``n_eff = 1``) adds none.
    """
    if not n_eff >= 1:
        raise PolicyError(f"n_eff (effective number of workers) must be >= 1, got {n_eff!r}")
    return max(floor, mu - (1.0 - 1.0 / n_eff))


@dataclasses.dataclass(frozen=True, kw_only=True)
class StalenessPolicy:
    """Everything the server asks about staleness, in one object (shared by the simulator and
    the real parameter server)."""

    bound: Bound = Bound.NONE
    """How staleness is bounded; SSP and REJECT need ``s_max``."""
    s_max: int | None = None
    """The staleness bound (clock spread for SSP, staleness for REJECT); >= 0."""
    lr_factor: Callable[[int], float] = inverse
    """Staleness -> multiplier of the nominal learning rate; must return a finite value >= 0."""
    lr_name: str = "inverse"
    """The factor's name in logs and reports."""
    momentum: float = 0.0
    """Momentum ``mu`` one would use synchronously (heavy ball, as ``torch.optim.SGD``)."""
    momentum_correction: bool = False
    """Lower the explicit momentum by the implicit momentum asynchrony adds (module docstring)."""
    momentum_floor: float = 0.0
    """Lowest explicit momentum the correction may choose (negative allowed)."""

    def __post_init__(self) -> None:
        bound = Bound(self.bound)  # raises ValueError naming the bad value
        object.__setattr__(self, "bound", bound)
        if bound is Bound.NONE:
            if self.s_max is not None:
                raise PolicyError(
                    f"s_max={self.s_max} given without a bound: choose bound='ssp' or 'reject'"
                )
        else:
            if self.s_max is None:
                raise PolicyError(f"bound {bound.value!r} needs s_max (an int >= 0)")
            if isinstance(self.s_max, bool) or not isinstance(self.s_max, int) or self.s_max < 0:
                raise PolicyError(
                    f"s_max must be an int >= 0 (0 = no staleness allowed), got {self.s_max!r}"
                )
        if not callable(self.lr_factor):
            raise PolicyError(f"lr_factor must be callable (int -> float), got {self.lr_factor!r}")
        if not (math.isfinite(self.momentum) and 0.0 <= self.momentum < 1.0):
            raise PolicyError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if not (math.isfinite(self.momentum_floor) and -1.0 < self.momentum_floor <= 1.0):
            raise PolicyError(f"momentum_floor must be in (-1, 1], got {self.momentum_floor!r}")

    def factor(self, s: int) -> float:
        """``lr_factor(s)``, checked: a finite float >= 0, else :class:`PolicyError`."""
        if s < 0:
            raise PolicyError(f"staleness must be >= 0, got {s}: a worker pulled a future version")
        value = self.lr_factor(s)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise PolicyError(
                f"lr policy {self.lr_name!r} returned {value!r} at s={s}, not a real number "
                "(nothing was applied)"
            )
        f = float(value)
        if not math.isfinite(f) or f < 0:
            raise PolicyError(
                f"lr policy {self.lr_name!r} returned {value!r} at s={s}: the factor must be a "
                "finite number >= 0 (nothing was applied)"
            )
        return f

    def admits(self, s: int) -> bool:
        """Whether an update of staleness ``s`` may be applied (False only under REJECT)."""
        return not (self.bound is Bound.REJECT and self.s_max is not None and s > self.s_max)

    def may_start(self, clock: int, slowest_clock: int) -> bool:
        """Whether a worker that has pushed ``clock`` updates may start its next step while the
        slowest live worker has pushed ``slowest_clock`` (False only under SSP)."""
        if self.bound is not Bound.SSP or self.s_max is None:
            return True
        return clock - slowest_clock <= self.s_max

    def explicit_momentum(self, mean_staleness: float) -> float:
        """The momentum to apply now: ``momentum``, or its corrected value when
        ``momentum_correction`` is on (``N_eff = 1 + mean_staleness``)."""
        if not self.momentum_correction:
            return self.momentum
        return corrected_momentum(
            self.momentum, 1.0 + max(0.0, mean_staleness), self.momentum_floor
        )

    def max_staleness(self, workers: int) -> int | None:
        """The largest staleness this policy lets through with ``workers`` workers (None: no
        bound). REJECT: ``s_max``; SSP: ``(workers - 1) * (2 s_max + 1)`` (module docstring)."""
        if self.s_max is None:
            return None
        if self.bound is Bound.REJECT:
            return self.s_max
        return (workers - 1) * (2 * self.s_max + 1)

    def describe(self) -> dict[str, object]:
        """JSON-ready summary for run reports."""
        return {
            "bound": self.bound.value,
            "s_max": self.s_max,
            "lr_factor": self.lr_name,
            "momentum": self.momentum,
            "momentum_correction": self.momentum_correction,
            "momentum_floor": self.momentum_floor,
        }


def make_policy(
    lr: str | Callable[[int], float] = "inverse",
    *,
    bound: str | Bound = Bound.NONE,
    s_max: int | None = None,
    alpha: float | None = None,
    momentum: float = 0.0,
    momentum_correction: bool = False,
    momentum_floor: float = 0.0,
) -> StalenessPolicy:
    """Build a :class:`StalenessPolicy` from names (the command line's way in).

    ``lr``: ``"inverse"``, ``"alpha-over-s"`` (with ``alpha``), ``"constant"`` or a callable.
    """
    if callable(lr):
        factor, name = lr, getattr(lr, "__name__", type(lr).__name__)
    elif lr == "alpha-over-s":
        factor, name = AlphaOverS(1.0 if alpha is None else alpha), lr
    elif lr in LR_FACTORS:
        if alpha is not None:
            raise PolicyError(f"alpha is only used by lr='alpha-over-s', not {lr!r}")
        factor, name = LR_FACTORS[lr], lr
    else:
        raise PolicyError(
            f"unknown lr policy {lr!r}; choose one of {', '.join(LR_FACTORS)} or pass a callable"
        )
    try:
        bound = Bound(bound)
    except ValueError:
        raise PolicyError(
            f"unknown bound {bound!r}; choose one of {', '.join(b.value for b in Bound)}"
        ) from None
    return StalenessPolicy(
        bound=bound,
        s_max=s_max,
        lr_factor=factor,
        lr_name=name,
        momentum=momentum,
        momentum_correction=momentum_correction,
        momentum_floor=momentum_floor,
    )
