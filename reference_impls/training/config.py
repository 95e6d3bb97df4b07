"""The run's configuration: typed sections, validated once, read from TOML or JSON.

A config file names every section it changes; what it leaves out keeps the default::

    seed = 1234
    max_epochs = 20
    val_every_steps = 0          # 0: validate once, at the end of every epoch

    [model]
    hidden = [32, 32]
    dropout = 0.1

    [data]
    num_train = 100
    batch_size = 10              # the global batch: split evenly over the ranks

    [optimizer]
    name = "adam"
    lr = 0.01

    [early_stopping]
    patience = 5                 # 0: never stop early (TOML has no null)

Unknown keys are errors (a typo such as ``paitence = 3`` must not run with the default), and
so are values of the wrong type; both name the key and the file. :meth:`TrainConfig.to_dict`
gives plain lists and scalars, which is what a checkpoint stores under ``config``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "ConfigError",
    "DataConfig",
    "EarlyStoppingConfig",
    "ModelConfig",
    "OptimizerConfig",
    "SchedulerConfig",
    "TrainConfig",
    "load_config",
]


class ConfigError(ValueError):
    """A config value, key or file is invalid; the message names it and says what is expected."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


# torch.finfo(torch.float32).max. The model's parameters are float32 and the optimizers scale
# them by lr and weight_decay (param.add_(grad, alpha=weight_decay)): a factor that float32
# cannot hold fails inside torch ("value cannot be converted to type float without overflow").
_FLOAT32_MAX = 3.4028234663852886e38


def _require_float32(value: float, key: str) -> None:
    _require(
        value <= _FLOAT32_MAX,
        f"{key} must be <= {_FLOAT32_MAX:.7g} (the largest float32: it scales the float32 "
        f"weights), got {value}",
    )


def _require_finite(section: object, prefix: str) -> None:
    """Every float field of ``section`` is a finite number.

    Checked before the range checks: ``inf`` passes ``>= 0`` and ``nan`` fails every
    comparison, so a range message alone would either let it through (``weight_decay = inf``
    trains to NaN weights) or blame the range instead of the value. TOML spells both (``inf``,
    ``nan``) and Python callers can pass them.
    """
    for field in dataclasses.fields(section):  # type: ignore[arg-type]
        value = getattr(section, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}{field.name} must be a finite number, got {value}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A multilayer perceptron: ``in_features -> hidden... -> out_features``, ReLU between."""

    in_features: int = 8
    """Width of each input example (the synthetic data has this many features)."""
    hidden: tuple[int, ...] = (32, 32)
    """Widths of the hidden layers; empty for a linear model."""
    out_features: int = 1
    """Width of each target."""
    dropout: float = 0.0
    """Dropout probability after each hidden activation. Above 0 the run draws from torch's
    RNG every step, which is what makes restoring the RNG state on resume matter."""

    def __post_init__(self) -> None:
        _require_finite(self, "model.")
        _require(self.in_features >= 1, f"model.in_features must be >= 1, got {self.in_features}")
        _require(
            self.out_features >= 1, f"model.out_features must be >= 1, got {self.out_features}"
        )
        for width in self.hidden:
            _require(width >= 1, f"model.hidden widths must be >= 1, got {list(self.hidden)}")
        _require(0.0 <= self.dropout < 1.0, f"model.dropout must be in [0, 1), got {self.dropout}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Synthetic regression data: targets from a fixed random two-layer teacher plus noise."""

    num_train: int = 100
    """Training examples."""
    num_val: int = 50
    """Validation examples (drawn from the same teacher, never trained on)."""
    noise: float = 0.1
    """Standard deviation of the Gaussian noise added to the targets."""
    batch_size: int = 10
    """The global batch: every optimizer step consumes this many examples over all ranks,
    ``batch_size / world_size`` on each, so a run's steps do not depend on the world size."""
    drop_last: bool = True
    """Drop the last incomplete batch of an epoch. False: fill it up with examples from the
    start of the epoch's permutation, so every rank still runs the same number of steps."""

    def __post_init__(self) -> None:
        _require_finite(self, "data.")
        _require(self.num_train >= 1, f"data.num_train must be >= 1, got {self.num_train}")
        _require(self.num_val >= 1, f"data.num_val must be >= 1, got {self.num_val}")
        _require(self.noise >= 0, f"data.noise must be >= 0, got {self.noise}")
        _require(self.batch_size >= 1, f"data.batch_size must be >= 1, got {self.batch_size}")
        _require(
            not self.drop_last or self.batch_size <= self.num_train,
            f"data.batch_size ({self.batch_size}) is larger than data.num_train "
            f"({self.num_train}) with drop_last = true: an epoch would have no steps",
        )

    def steps_per_epoch(self) -> int:
        full, rest = divmod(self.num_train, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1


OptimizerName = typing.Literal["sgd", "adam", "adamw"]
SchedulerName = typing.Literal["constant", "step", "cosine"]
_OPTIMIZERS: tuple[str, ...] = typing.get_args(OptimizerName)
_SCHEDULERS: tuple[str, ...] = typing.get_args(SchedulerName)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    name: OptimizerName = "adam"
    """One of sgd, adam, adamw (torch.optim)."""
    lr: float = 1e-2
    """Peak learning rate."""
    weight_decay: float = 0.0
    momentum: float = 0.9
    """SGD only."""

    def __post_init__(self) -> None:
        _require_finite(self, "optimizer.")
        _require(
            self.name in _OPTIMIZERS,
            f"optimizer.name must be one of {', '.join(_OPTIMIZERS)}, got {self.name!r}",
        )
        _require(self.lr > 0, f"optimizer.lr must be > 0, got {self.lr}")
        _require_float32(self.lr, "optimizer.lr")
        _require_float32(self.weight_decay, "optimizer.weight_decay")
        _require(
            self.weight_decay >= 0, f"optimizer.weight_decay must be >= 0, got {self.weight_decay}"
        )
        _require(
            0 <= self.momentum < 1, f"optimizer.momentum must be in [0, 1), got {self.momentum}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """The learning-rate schedule, stepped once per optimizer step."""

    name: SchedulerName = "constant"
    """constant; step (multiply by ``gamma`` every ``step_size`` steps); cosine (from lr to
    ``min_lr`` over the run's planned steps: max_steps, else max_epochs x steps per epoch)."""
    step_size: int = 10
    gamma: float = 0.5
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        _require_finite(self, "scheduler.")
        _require(
            self.name in _SCHEDULERS,
            f"scheduler.name must be one of {', '.join(_SCHEDULERS)}, got {self.name!r}",
        )
        _require(self.step_size >= 1, f"scheduler.step_size must be >= 1, got {self.step_size}")
        _require(0 < self.gamma <= 1, f"scheduler.gamma must be in (0, 1], got {self.gamma}")
        _require(self.min_lr >= 0, f"scheduler.min_lr must be >= 0, got {self.min_lr}")
        _require_float32(self.min_lr, "scheduler.min_lr")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EarlyStoppingConfig:
    """Stop when the validation loss has not improved for ``patience`` validation checks."""

    patience: int | None = 5
    """Validation checks in a row without improvement after which the run stops. 0 (or None,
    from Python or a JSON ``null``): never stop early; it is stored as None. Left out: 5. The
    count is against the best value of the whole run, not the previous check."""
    min_delta: float = 0.0
    """An improvement must lower the best validation loss by more than this."""

    def __post_init__(self) -> None:
        _require_finite(self, "early_stopping.")
        _require(
            self.patience is None or self.patience >= 0,
            f"early_stopping.patience must be >= 1, or 0 to never stop early (patience = 0 "
            f"under [early_stopping]; left out it is 5), got {self.patience}",
        )
        if self.patience == 0:
            # One spelling of "disabled" downstream (EarlyStopping, checkpoints): TOML has no
            # null, so 0 is how a config file says it.
            object.__setattr__(self, "patience", None)
        _require(
            self.min_delta >= 0, f"early_stopping.min_delta must be >= 0, got {self.min_delta}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything that defines a run. Stored in every checkpoint under ``config``."""

    seed: int = 0
    """Seeds the data, the model's initialization and every RNG the loop uses."""
    max_epochs: int = 10
    """Epochs at most (numbered from 0: a run that stops "at epoch 7" trained 8 epochs)."""
    max_steps: int | None = None
    """Optimizer steps at most; None: only max_epochs limits the run."""
    val_every_steps: int = 0
    """Validate (and write ``latest``) every this many optimizer steps, also in the middle of
    an epoch; 0: once at the end of every epoch."""
    log_every_steps: int = 1
    """Write a training row to ``metrics.jsonl`` every this many steps."""
    progress: bool = True
    """Progress bars for epochs and steps (rank 0, and only when stderr is a terminal)."""
    device: str = "cpu"
    """cpu or cuda (each rank takes ``cuda:LOCAL_RANK``)."""
    num_threads: int | None = None
    """torch intra-op threads; None: torch's default. Bit-exact resume needs the same value."""
    allow_non_finite_loss: bool = False
    """False (the default): a train or validation loss that is NaN or infinite, or weights
    that are, stop the run with :class:`~reference_impls.training.loop.TrainingDivergedError`
    before anything is checkpointed, so ``latest.pt`` and ``best.pt`` keep the last finite
    weights. True: keep training (to study a divergence); such losses then count as no
    improvement for early stopping and checkpoints hold whatever the weights are."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    early_stopping: EarlyStoppingConfig = dataclasses.field(default_factory=EarlyStoppingConfig)

    def __post_init__(self) -> None:
        _require_finite(self, "")
        _require(0 <= self.seed < 2**63, f"seed must be in [0, 2**63), got {self.seed}")
        _require(self.max_epochs >= 1, f"max_epochs must be >= 1, got {self.max_epochs}")
        _require(
            self.max_steps is None or self.max_steps >= 1,
            f"max_steps must be >= 1 (or absent), got {self.max_steps}",
        )
        _require(
            self.val_every_steps >= 0, f"val_every_steps must be >= 0, got {self.val_every_steps}"
        )
        _require(
            self.log_every_steps >= 1, f"log_every_steps must be >= 1, got {self.log_every_steps}"
        )
        _require(self.device in ("cpu", "cuda"), f"device must be cpu or cuda, got {self.device!r}")
        _require(
            self.num_threads is None or self.num_threads >= 1,
            f"num_threads must be >= 1 (or absent), got {self.num_threads}",
        )
        _require(
            self.scheduler.name != "cosine" or self.scheduler.min_lr <= self.optimizer.lr,
            f"scheduler.min_lr ({self.scheduler.min_lr}) must be <= optimizer.lr "
            f"({self.optimizer.lr}): the cosine schedule goes from lr down to min_lr",
        )

    def planned_steps(self) -> int:
        """Optimizer steps of a run that does not stop early."""
        by_epochs = self.max_epochs * self.data.steps_per_epoch()
        return by_epochs if self.max_steps is None else min(self.max_steps, by_epochs)

    # ----------------------------------------------------------------------- conversions

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts, lists and scalars (TOML/JSON/``torch.load(weights_only=True)`` safe)."""
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> TrainConfig:
        """Build and validate; unknown keys and wrong types raise :class:`ConfigError`."""
        try:
            return _build(cls, data, "", source)
        except ConfigError as exc:
            text = str(exc)
            raise ConfigError(text if text.startswith(source) else f"{source}: {text}") from None

    def replace(self, overrides: Mapping[str, Any]) -> TrainConfig:
        """A copy with dotted keys replaced: ``{"model.dropout": 0.1, "max_epochs": 3}``."""
        data = self.to_dict()
        for dotted, value in overrides.items():
            *parents, leaf = dotted.split(".")
            table = data
            for part in parents:
                if not isinstance(table.get(part), dict):
                    raise ConfigError(f"override {dotted!r}: {part!r} is not a config section")
                table = table[part]
            if leaf not in table:
                known = ", ".join(sorted(table))
                raise ConfigError(f"override {dotted!r}: unknown key {leaf!r}; known keys: {known}")
            table[leaf] = value
        return TrainConfig.from_dict(data, source="overrides")


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """Read a ``.toml`` or ``.json`` config file, apply dotted ``overrides``, validate."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"{path}: config files are .toml or .json, got {path.suffix!r}")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from None
    config = TrainConfig.from_dict(data, source=str(path))
    return config.replace(overrides) if overrides else config


# --------------------------------------------------------------------------- helpers


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _build(cls: type, data: object, prefix: str, source: str) -> Any:
    where = prefix.rstrip(".") or "the top level"
    if not isinstance(data, Mapping):
        raise ConfigError(f"[{where}] must be a table, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(prefix + k for k in unknown)} in [{where}]; "
            f"known keys: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        key = prefix + name
        expected = hints[name]
        if isinstance(expected, type) and dataclasses.is_dataclass(expected):
            kwargs[name] = _build(expected, value, key + ".", source)
        else:
            kwargs[name] = _coerce(value, expected, key)
    return cls(**kwargs)


def _coerce(value: object, expected: Any, key: str) -> Any:
    """``value`` as type ``expected`` (int, float, bool, str, tuple[int, ...], X | None)."""
    origin = typing.get_origin(expected)
    if origin is typing.Literal:
        # A choice: its type is checked here, its value by the dataclass, whose message
        # lists the choices.
        return _coerce(value, type(typing.get_args(expected)[0]), key)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(expected)
        if value is None and type(None) in options:
            return None
        (inner,) = [o for o in options if o is not type(None)]
        return _coerce(value, inner, key)
    if origin is tuple:
        (item, _) = typing.get_args(expected)
        if isinstance(value, str) or not isinstance(value, Sequence):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return tuple(_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value))
    if expected is bool:
        ok = isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if isinstance(value, (int, float)) and ok:
            value = float(value)
    else:
        ok = isinstance(value, expected)
    if not ok:
        raise ConfigError(f"{key} must be {getattr(expected, '__name__', expected)}, got {value!r}")
    return value
