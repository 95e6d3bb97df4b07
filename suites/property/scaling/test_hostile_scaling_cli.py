"""Hostile command lines for ``python -m reference_impls.scaling`` (hypothesis): whatever
numbers ``project`` and ``investigate`` are given, the command ends one of two ways, never
with a traceback:

- exit 0 (``project`` only): a table or JSON whose every number is finite;
- exit 2: ``error: ...`` naming the flag or value that was bad, and for ``investigate``
  nothing created (it checks every argument before any rank starts).

``investigate`` always gets one argument known to be bad among random others, so that no
example starts ranks (the random ones may be valid). ``main()`` runs in-process.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impls.scaling.__main__ import main

NUMBERS = ["0", "-0", "1", "-1", "0.5", "1e-300", "1e308", "nan", "inf", "-inf", "x", "", "1e400"]
INTS = ["0", "1", "-1", "8", "1000000000000", str(2**53), str(2**53 + 1), "2.5", "x", ""]
WORLDS = ["1", "1,8", "1,1000000000000", "8,64,512", "0,8", "1,,2", "1,-4", "x", str(2**60)]
PROJECT_FLAGS = {
    "--fixed-ms": NUMBERS,
    "--per-sample-us": NUMBERS,
    "--grad-bytes": INTS,
    "--buckets": INTS,
    "--backward-fraction": NUMBERS,
    "--batch": INTS,
    "--alpha-us": NUMBERS,
    "--beta-GBps": NUMBERS,
    "--gpus-per-node": INTS,
    "--inter-alpha-us": NUMBERS,
    "--inter-beta-GBps": NUMBERS,
    "--worlds": WORLDS,
}
VALID = {
    "--per-sample-us": "6250",
    "--grad-bytes": "1073741824",
    "--batch": "1024",
    "--alpha-us": "42",
    "--beta-GBps": "23",
}
INVESTIGATE_FLAGS = {
    "--project-worlds": WORLDS,
    "--world-sizes": WORLDS,
    "--global-batch": INTS,
    "--steps": INTS,
    "--hidden": ["256,256", "0", "1,x", ""],
    "--link-alpha-us": NUMBERS,
    "--link-beta-GBps": NUMBERS,
    "--gpus-per-node": INTS,
    "--loader-sleep-ms": NUMBERS,
    "--timeout-s": NUMBERS,
}
# Each refused whatever else is given (checked before any rank starts).
KNOWN_BAD = [
    ("--steps", "2"),
    ("--modes", "diagonal"),
    ("--project-worlds", str(2**60)),
    ("--timeout-s", "nan"),
    ("--world-sizes", "2,4"),
]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse's own refusals
            status = exc.code if isinstance(exc.code, int) else 2
    return status, out.getvalue(), err.getvalue()


def _stem(flag: str) -> str:
    """--inter-alpha-us -> inter_alpha: the library's messages name fields in their units."""
    stem = flag[2:].replace("-", "_")
    for unit in ("_us", "_ms", "_GBps"):
        stem = stem.removesuffix(unit)
    return stem.removesuffix("s")  # --worlds: "world sizes must be ..."


def _finite(value: object) -> bool:
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


@settings(max_examples=60, deadline=None)
@given(
    changes=st.dictionaries(
        st.sampled_from(sorted(PROJECT_FLAGS)), st.none(), min_size=1, max_size=4
    ).flatmap(
        lambda keys: st.fixed_dictionaries({k: st.sampled_from(PROJECT_FLAGS[k]) for k in keys})
    ),
    as_json=st.booleans(),
)
def test_project_answers_with_finite_numbers_or_refuses_naming_the_value(changes, as_json):
    argv = ["project"]
    for flag, value in {**VALID, **changes}.items():
        argv.append(f"{flag}={value}")  # "=": a value starting with '-' stays a value
    if as_json:
        argv.append("--json")

    status, out, err = run_cli(argv)

    assert "Traceback" not in err
    assert status in (0, 2), (status, err)
    if status == 0:
        if as_json:
            assert _finite(json.loads(out))  # json.loads accepts NaN; _finite does not
        else:
            assert "nan" not in out and "inf" not in out, out
    else:
        assert "error:" in err
        named = [f for f in changes if f in err or _stem(f) in err.replace("-", "_")]
        named += [v for v in changes.values() if v and v in err]
        assert named, f"the message names none of {changes}: {err}"


@settings(max_examples=30, deadline=None)
@given(
    changes=st.dictionaries(
        st.sampled_from(sorted(INVESTIGATE_FLAGS)), st.none(), max_size=3
    ).flatmap(
        lambda keys: st.fixed_dictionaries({k: st.sampled_from(INVESTIGATE_FLAGS[k]) for k in keys})
    ),
    bad=st.sampled_from(KNOWN_BAD),
)
def test_investigate_refuses_before_any_rank_starts(changes, bad):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        argv = ["investigate", "--out", str(out), "--device", "cpu"]
        for flag, value in {**changes, bad[0]: bad[1]}.items():
            argv.append(f"{flag}={value}")

        status, _, err = run_cli(argv)

        assert "Traceback" not in err
        assert status == 2, (status, err)
        assert "error:" in err
        assert not out.exists()


@settings(max_examples=100, deadline=None)
@given(
    comm=st.floats(0, 10),
    backward=st.floats(0, 10),
    buckets=st.integers(1, 200),
)
def test_the_closed_form_exposed_time_is_the_bucket_by_bucket_schedule(comm, backward, buckets):
    from reference_impls.scaling.costmodel import _exposed

    per, finish = comm / buckets, 0.0
    for i in range(1, buckets + 1):  # the schedule itself: bucket i ready after i/k of backward
        finish = max(finish, backward * i / buckets) + per
    loop = 0.0 if comm == 0 else min(comm, max(0.0, finish - backward))
    assert math.isclose(_exposed(comm, backward, buckets, True), loop, rel_tol=1e-9, abs_tol=1e-12)
