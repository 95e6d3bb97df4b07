"""The models async SGD trains here: small, synthetic, seeded, with a known optimum.

* ``logreg``: L2-regularized logistic regression (strongly convex: a unique optimum, found to
  float64 precision by :meth:`Problem.optimum`), the convex problem of the tests and the demo.
* ``mlp``: a one-hidden-layer MLP on a synthetic regression target, for throughput
  benchmarks (``dim=1000, hidden=1000`` is the 1M-parameter model of the benchmarks).

Parameters travel as one flat float32 vector (what the server stores and the wire carries);
:meth:`Problem.gradient` writes it into a module, runs forward and backward and returns the
flat gradient. Worker ``w`` owns the shard ``w, w + N, w + 2N, ...`` of the samples, and its
``k``-th minibatch is drawn from a generator seeded by ``(seed, w, k)``: any worker's data
stream is replayable, also after a server resume (``k`` is the worker's clock).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from reference_impls.seeds import mix_seed

__all__ = ["Problem", "ProblemConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProblemConfig:
    """A synthetic problem."""

    kind: Literal["logreg", "mlp"] = "logreg"
    samples: int = 1024
    """Training samples (all workers together)."""
    dim: int = 16
    """Input features."""
    hidden: int = 32
    """Hidden width (``mlp`` only)."""
    batch_size: int = 16
    """Minibatch per gradient."""
    l2: float = 1e-2
    """L2 penalty ``l2/2 |w|^2`` in the loss (makes ``logreg`` strongly convex)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("logreg", "mlp"):
            raise ValueError(f"problem kind must be 'logreg' or 'mlp', got {self.kind!r}")
        for name in ("samples", "dim", "hidden", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            # torch accepts any int but numpy's generators refuse negatives deep in a run,
            # with a message that does not say which value.
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if not self.l2 >= 0:
            raise ValueError(f"l2 must be >= 0, got {self.l2!r}")


class Problem:
    """Data, model and loss of one :class:`ProblemConfig` (identical in every process)."""

    def __init__(self, config: ProblemConfig) -> None:
        self.config = c = config
        g = torch.Generator().manual_seed(c.seed)
        self.x = torch.randn(c.samples, c.dim, generator=g)  # (n, d)
        if c.kind == "logreg":
            w_true = torch.randn(c.dim, generator=g) * (2.0 / c.dim**0.5)  # (d,)
            p = torch.sigmoid(self.x @ w_true)
            self.y = (torch.rand(c.samples, generator=g) < p).float()  # (n,) labels in {0, 1}
        else:
            w_true = torch.randn(c.dim, generator=g) / c.dim**0.5
            self.y = torch.tanh(self.x @ w_true) + 0.1 * torch.randn(c.samples, generator=g)
        torch.manual_seed(c.seed)
        self.module = self.build_module()
        self.init_params = parameters_to_vector(self.module.parameters()).detach().clone()

    def build_module(self) -> nn.Module:
        """A fresh module with this problem's architecture, initialized from ``config.seed``."""
        c = self.config
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(c.seed)
        try:
            if c.kind == "logreg":
                return nn.Linear(c.dim, 1)
            return nn.Sequential(nn.Linear(c.dim, c.hidden), nn.Tanh(), nn.Linear(c.hidden, 1))
        finally:
            torch.random.set_rng_state(gen_state)

    @property
    def numel(self) -> int:
        return self.init_params.numel()

    def batch_indices(self, worker: int, workers: int, step: int) -> torch.Tensor:
        """Indices of worker ``worker``'s ``step``-th minibatch (its shard, seeded draw)."""
        shard = torch.arange(worker % workers, self.config.samples, workers)
        if not shard.numel():  # more workers than samples: this worker's shard is empty
            raise ValueError(
                f"samples must be >= workers ({workers}): worker {worker} has no samples of "
                f"its own, got samples={self.config.samples}"
            )
        # Replayable: the draw depends on (seed, worker, step) only, in any process.
        g = torch.Generator().manual_seed(mix_seed(self.config.seed, "batch", worker, step))
        pick = torch.randint(0, shard.numel(), (self.config.batch_size,), generator=g)
        return shard[pick]

    def loss_fn(self, module: nn.Module, idx: torch.Tensor | None = None) -> torch.Tensor:
        """Mean loss over ``idx`` (all samples when None), L2 penalty included."""
        x, y = (self.x, self.y) if idx is None else (self.x[idx], self.y[idx])
        out = module(x).squeeze(-1)  # (b,)
        if self.config.kind == "logreg":
            loss = nn.functional.binary_cross_entropy_with_logits(out, y)
        else:
            loss = nn.functional.mse_loss(out, y)
        if self.config.l2:
            loss = loss + 0.5 * self.config.l2 * sum((p * p).sum() for p in module.parameters())
        return loss

    def gradient(self, params: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, float]:
        """(flat gradient, loss) of the minibatch ``idx`` at the flat ``params``."""
        vector_to_parameters(params, self.module.parameters())
        self.module.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.module, idx)
        grads = torch.autograd.grad(loss, list(self.module.parameters()))
        return torch.cat([g.reshape(-1) for g in grads]), float(loss.detach())

    @torch.no_grad()
    def full_loss(self, params: torch.Tensor) -> float:
        """Loss over all samples at the flat ``params``."""
        vector_to_parameters(params, self.module.parameters())
        return float(self.loss_fn(self.module))

    def optimum(self) -> tuple[torch.Tensor, float]:
        """(parameters, loss) at the minimum of the convex ``logreg``, by Newton's method in
        float64 (the L2 term makes the Hessian positive definite; converges in ~10 steps)."""
        if self.config.kind != "logreg":
            raise ValueError("optimum() needs the convex problem (kind='logreg')")
        n, d = self.x.shape
        xb = torch.cat([self.x.double(), torch.ones(n, 1, dtype=torch.float64)], 1)  # (n, d+1)
        y = self.y.double()
        theta = torch.zeros(d + 1, dtype=torch.float64)  # (weight..., bias) as nn.Linear flat
        for _ in range(100):
            p = torch.sigmoid(xb @ theta)
            grad = xb.T @ (p - y) / n + self.config.l2 * theta
            hess = (xb.T * (p * (1 - p))) @ xb / n + self.config.l2 * torch.eye(d + 1).double()
            step = torch.linalg.solve(hess, grad)
            theta -= step
            if float(step.abs().max()) < 1e-13:
                break
        params = theta.float()
        m = self.build_module().double()
        vector_to_parameters(theta, m.parameters())
        with torch.no_grad():
            loss = float(self.loss_fn_double(m))
        return params, loss

    def loss_fn_double(self, module: nn.Module) -> torch.Tensor:
        out = module(self.x.double()).squeeze(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(out, self.y.double())
        return loss + 0.5 * self.config.l2 * sum((p * p).sum() for p in module.parameters())
