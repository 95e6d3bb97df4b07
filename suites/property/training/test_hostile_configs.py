"""Hostile configs for reference_impls.training (hypothesis): whatever values a config file or
``--set`` gives, the command line ends one of three ways, never with a traceback:

- exit 0: the run finished, every value it reports is as valid as the config it accepted;
- exit 2: the config was refused, and the message names the key that was bad;
- exit 3: the run diverged (a non-finite loss), and said so.

Values are drawn per key from the edges of the valid range (0, denormals, 1e308, -0.0) and
from invalid ones (-1, NaN, inf, bools, strings, null, wrong lists); sizes stay small so that
a run accepted with them takes milliseconds. ``main()`` runs in-process on a fresh run directory.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_impls.training.__main__ import main

NAN, INF = math.nan, math.inf
WRONG_TYPES = ["x", True, None, [1]]
TINY, HUGE = 5e-324, 1e308  # the smallest denormal, near the largest double
# Per key: (values at the edges of what is valid, values that are not). Sizes stay small.
SIZE = ([1, 2, 3], [-1, 0, 2.5, *WRONG_TYPES])
COUNT = ([0, 1, 2], [-1, 2.5, *WRONG_TYPES])
POSITIVE = ([TINY, 1e-8, 0.01, 1.0, 1e30, HUGE], [NAN, INF, -INF, -1.0, 0.0, *WRONG_TYPES])
NON_NEGATIVE = ([0.0, -0.0, TINY, 0.5, 1.0, 1e30, HUGE], [NAN, INF, -INF, -1.0, *WRONG_TYPES])
FRACTION = ([0.0, TINY, 0.5, 0.999999], [NAN, INF, -1.0, 1.0, 2.0, *WRONG_TYPES])
VALUES: dict[str, tuple[list, list]] = {
    "seed": ([0, 7, 2**63 - 1], [-1, 2**63, 1.5, *WRONG_TYPES]),
    "max_epochs": SIZE,
    "max_steps": ([1, 2], [-1, 0, 2.5, "x", True]),
    "val_every_steps": COUNT,
    "log_every_steps": SIZE,
    "num_threads": ([1], [-1, 0, 1.0, "x", True]),
    "device": (["cpu"], ["cuda", "tpu", "", 0, None]),
    "allow_non_finite_loss": ([True, False], [0, "true", None]),
    "model.in_features": SIZE,
    "model.hidden": ([[], [3], [3, 2]], [[0], [-1], [2.5], [True], "3", None, 3]),
    "model.out_features": SIZE,
    "model.dropout": FRACTION,
    "data.num_train": SIZE,
    "data.num_val": SIZE,
    "data.noise": NON_NEGATIVE,
    "data.batch_size": SIZE,
    "data.drop_last": ([True, False], [1, "false", None]),
    "optimizer.name": (["sgd", "adam", "adamw"], ["ADAM", "", 1, None]),
    "optimizer.lr": POSITIVE,
    "optimizer.weight_decay": NON_NEGATIVE,
    "optimizer.momentum": FRACTION,
    "scheduler.name": (["constant", "step", "cosine"], ["linear", None]),
    "scheduler.step_size": SIZE,
    "scheduler.gamma": ([TINY, 0.5, 1.0], [NAN, INF, 0.0, -1.0, 1.5, *WRONG_TYPES]),
    "scheduler.min_lr": NON_NEGATIVE,
    "early_stopping.patience": ([0, 1, 2], [-1, 1.0, "x", True, [1]]),
    "early_stopping.min_delta": NON_NEGATIVE,
}
# A valid base that trains in a few milliseconds: 3 examples, batches of 1, 1 epoch.
BASE = """
max_epochs = 1
progress = false
num_threads = 1
[model]
in_features = 2
hidden = [3]
[data]
num_train = 3
num_val = 2
batch_size = 1
"""


def toml_value(value) -> str:
    """``value`` as ``--set`` parses it (a TOML value); None as the bare word null."""
    if value is None:
        return "null"  # not TOML: reaches the config as the string "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return json.dumps(value)  # ints, strings, lists: the same spelling in TOML


def value_of(key: str) -> st.SearchStrategy:
    valid, invalid = VALUES[key]
    # Valid values twice as often: a config with one bad value among several is refused at
    # the first, and the accepted-but-extreme ones are where silent failures hide.
    return st.one_of(st.sampled_from(valid), st.sampled_from(valid), st.sampled_from(invalid))


overrides = st.dictionaries(
    st.sampled_from(sorted(VALUES)), st.none(), min_size=1, max_size=4
).flatmap(lambda keys: st.fixed_dictionaries({k: value_of(k) for k in keys}))


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in this process: (status, stdout, stderr). The root logging handler
    that main() installs is removed again, so that it never outlives the captured stream."""
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers = list(root.handlers)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(argv)
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
    return status, out.getvalue(), err.getvalue()


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns about some accepted settings
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=overrides)
def test_any_config_ends_in_a_result_a_refusal_naming_the_key_or_a_divergence(changes):
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "run.toml"
        config.write_text(BASE)
        argv = ["--config", str(config), "--run-dir", str(Path(tmp) / "run")]
        for key, value in changes.items():
            argv += ["--set", f"{key}={toml_value(value)}"]

        status, out, err = run_cli(argv)

    assert "Traceback" not in err
    if status == 0:
        result = json.loads(out)
        assert result["stop_reason"] in ("max_epochs", "max_steps", "early_stopping")
        if changes.get("allow_non_finite_loss") is not True:
            assert math.isfinite(float(result["last_val_loss"]))
    elif status == 2:
        assert err.startswith("error: overrides: ") or "error: device is 'cuda'" in err, err
        named = [k for k in changes if k in err or k.split(".")[-1] in err]
        assert named, f"the message names none of {sorted(changes)}: {err}"
    else:
        assert status == 3, (status, err)
        assert "training diverged" in err
