"""Hostile command lines for ``python -m reference_impls.async_sgd simulate`` (hypothesis):
whatever the options, the command ends one of two ways, never with a traceback:

- exit 0: the run directory holds the run (and OUT/control with ``--control``);
- exit 2: ``error: ...`` naming the option or value that was bad, and ``--out`` not created.

Values come from the edges of the valid range (0, 1e-300, 1e308) and beyond it (-1, NaN, inf,
text); sizes stay small so that an accepted run takes milliseconds. ``main()`` in-process.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impls.async_sgd.__main__ import main

FLOATS = ["0", "-1", "1e-300", "0.5", "1", "3", "1e308", "nan", "inf", "x"]
SMALL = ["0", "1", "2", "3", "-1", "2.5", "x"]
OPTIONS = {
    "--workers": SMALL,
    "--updates": ["1", "5", "0", "-3", "x"],
    "--lr": FLOATS,
    "--seed": ["0", "7", "-1", "x"],
    "--stragglers": SMALL,
    "--slowdown": FLOATS,
    "--stall-every-ms": FLOATS,
    "--stall-ms": FLOATS,
    "--dies": SMALL,
    "--dies-at-ms": FLOATS,
    "--policy": ["inverse", "alpha-over-s", "constant", "bogus"],
    "--alpha": FLOATS,
    "--bound": ["none", "ssp", "reject", "bogus"],
    "--s-max": SMALL,
    "--momentum": FLOATS,
    "--samples": ["1", "8", "0", "x"],
    "--dim": ["1", "4", "0"],
    "--batch-size": ["1", "4", "0", "100"],
}
BASE = ["simulate", "--workers", "2", "--updates", "5", "--samples", "16", "--dim", "4"]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's own refusals
            status = exc.code if isinstance(exc.code, int) else 2
    return status, out.getvalue(), err.getvalue()


@settings(max_examples=150, deadline=None)
@given(
    changes=st.dictionaries(
        st.sampled_from(sorted(OPTIONS)), st.none(), min_size=1, max_size=4
    ).flatmap(lambda keys: st.fixed_dictionaries({k: st.sampled_from(OPTIONS[k]) for k in keys})),
    control=st.booleans(),
)
def test_simulate_runs_or_refuses_naming_the_option_and_writes_nothing(changes, control):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [*BASE, *(f"{k}={v}" for k, v in changes.items()), "--out", str(out)]
        if control:
            argv.append("--control")

        status, _, err = run_cli(argv)

        assert "Traceback" not in err
        assert status in (0, 2), (status, err)
        if status == 0:
            assert any(out.iterdir())
            assert not control or (out / "control").is_dir()
        else:
            assert "error:" in err
            assert not out.exists(), err  # refused before the run directory was made
            stems = {k: k[2:].replace("-", "_") for k in changes}
            named = [
                k
                for k, v in changes.items()
                if k in err or stems[k] in err.replace("-", "_") or (v and f"'{v}'" in err)
            ]
            # A combination's message may name the option the bad value collides with
            # (--stragglers vs --workers, --s-max vs --bound): one named option suffices.
            assert named or "worker" in err or "bound" in err, (changes, err)
