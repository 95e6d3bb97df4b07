"""One base seed per run; every test's seed derived from it; determinism switches.

The base seed is printed in the run's header. A test's seed is a hash of the base seed and
its node id, so it does not depend on which other tests ran or in what order: rerunning one
failing test with the same base seed gives it the same seed it had in the full run.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import random
import re
import secrets
import sys
from collections.abc import Callable

__all__ = [
    "CUBLAS_WORKSPACE_CONFIG",
    "node_seed",
    "enable_determinism",
    "load_hypothesis_profile",
    "new_base_seed",
    "parse_seed",
    "register_hypothesis_profiles",
    "seed_everything",
]

SEED_BITS = 32
"""NumPy's legacy global seed takes at most 2**32 - 1; every RNG here accepts that range."""

CUBLAS_WORKSPACE_CONFIG = ":4096:8"
"""cuBLAS needs a fixed workspace for deterministic results (CUDA docs, "Results
reproducibility"); torch.use_deterministic_algorithms raises on CUDA >= 10.2 without it."""


_DECIMAL = re.compile(r"[0-9]+", re.ASCII)


def parse_seed(text: str) -> int:
    """The seed written in ``text``: plain ASCII decimal digits, in ``[0, 2**32)``.

    Stricter than ``int()``, which also takes ``" 7"``, ``"+7"``, ``"1_000"`` and non-ASCII
    digits: a seed is copied between a report, a shell and a CI config, and each of those
    forms reads differently in one of them. Raises ``ValueError`` naming the value.
    """
    if not isinstance(text, str) or not _DECIMAL.fullmatch(text):
        raise ValueError(f"a seed is a decimal integer in [0, 2**{SEED_BITS}), got {text!r}")
    # Compare lengths first: int() refuses strings of over 4300 digits with its own message.
    if len(text.lstrip("0")) > len(str(2**SEED_BITS)) or int(text) >= 2**SEED_BITS:
        raise ValueError(
            f"a seed must be in [0, 2**{SEED_BITS}) = [0, {2**SEED_BITS - 1}], got {text}"
        )
    return int(text)


def new_base_seed() -> int:
    """A fresh base seed for a run that was not given one."""
    return secrets.randbelow(2**SEED_BITS)


def node_seed(base_seed: int, nodeid: str) -> int:
    """The seed of one test: stable across processes and Python versions (no ``hash()``)."""
    digest = hashlib.sha256(f"{base_seed}:{nodeid}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (1 << SEED_BITS)


def seed_everything(seed: int) -> list[str]:
    """Seed Python's ``random``, NumPy's global RNG and torch (CPU and every CUDA device).

    NumPy is imported when installed: its global RNG starts from OS entropy, so an unseeded
    draw in a test that imports NumPy late would otherwise be nondeterministic. torch is seeded
    only when already imported (importing it costs over a second, and torch's default generator
    starts from a fixed seed anyway). Returns the names of what was seeded.
    """
    seeded = ["random"]
    random.seed(seed)
    if "numpy" in sys.modules or importlib.util.find_spec("numpy") is not None:
        import numpy

        numpy.random.seed(seed)
        seeded.append("numpy")
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "manual_seed"):
        torch.manual_seed(seed)  # also seeds every CUDA device's generator
        seeded.append("torch")
    return seeded


def enable_determinism() -> None:
    """Ask torch for deterministic kernels; ops without one raise instead of varying.

    Sets ``CUBLAS_WORKSPACE_CONFIG`` (kept if already set), ``torch.use_deterministic_algorithms``,
    cuDNN's deterministic flag and turns off cuDNN autotuning (which picks kernels by timing).
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    import torch

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


# --------------------------------------------------------------------------- hypothesis


def register_hypothesis_profiles() -> bool:
    """Register the harness's hypothesis profiles; False when hypothesis is not installed.

    ``ci`` is derandomized (the same examples on every run, so CI is not a lottery) and keeps
    no example database; ``nightly`` runs many more examples from fresh randomness; ``dev`` is
    hypothesis's defaults seeded from the run's base seed. Deadlines are off everywhere: on
    shared CI runners a slow example is noise, not a bug.
    """
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return False
    # Explicit parent: register_profile otherwise inherits from whatever profile is loaded now.
    base = settings.get_profile("default")
    # A 2-core shared runner makes data generation look slow; that is not the code's fault.
    slow_ok = [HealthCheck.too_slow]
    settings.register_profile("dev", base, deadline=None)
    settings.register_profile(
        "ci",
        base,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=slow_ok,
    )
    settings.register_profile(
        "nightly",
        base,
        max_examples=2000,
        database=None,
        deadline=None,
        print_blob=True,
        suppress_health_check=slow_ok,
    )
    return True


_on_import: list[Callable[[], object]] = []
"""What to run when hypothesis is first imported (set by the plugin for its run, see
:func:`defer_hypothesis_profile`)."""

HYPOTHESIS_ENTRY_POINT = "harness.seeding:on_hypothesis_import"
"""This package's entry point in hypothesis's ``hypothesis`` group (pyproject.toml)."""


def on_hypothesis_import() -> None:
    """Hypothesis's documented plug-in hook (the ``hypothesis`` entry-point group): hypothesis
    calls it at the end of its first import, before any test module can build a ``@settings``
    or ``@given`` from the loaded profile. Registers the harness's profiles and loads the
    run's, if a pytest run asked for that (:func:`defer_hypothesis_profile`)."""
    register_hypothesis_profiles()
    for action in list(_on_import):
        action()


def hypothesis_hook_installed() -> bool:
    """Whether hypothesis will call :func:`on_hypothesis_import` when it is imported: the
    package's entry point is installed and ``$HYPOTHESIS_NO_PLUGINS`` does not turn it off."""
    return not os.environ.get("HYPOTHESIS_NO_PLUGINS") and _entry_point_installed()


@functools.cache
def _entry_point_installed() -> bool:
    """Scanned once per process (the plugin asks at addoption and at configure)."""
    from importlib.metadata import entry_points

    return any(ep.value == HYPOTHESIS_ENTRY_POINT for ep in entry_points(group="hypothesis"))


def defer_hypothesis_profile(action: Callable[[], object] | None) -> None:
    """Run ``action`` when hypothesis is first imported (None: forget it). The plugin loads
    the run's profile this way: importing hypothesis costs over a second, and a pytest run
    whose tests never use it (a harness subprocess, a plain unit suite) should not pay it."""
    _on_import.clear()
    if action is not None:
        _on_import.append(action)


def hypothesis_profile_name(given: str | None, *, ci: bool) -> str:
    """The profile :func:`load_hypothesis_profile` would load, without importing hypothesis."""
    return given or os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if ci else "dev")


def load_hypothesis_profile(
    given: str | None, *, ci: bool, seed: int, force_seed: bool = True
) -> str | None:
    """Load the run's hypothesis profile and return its name (None: hypothesis not imported).

    ``given`` is ``--hypothesis-profile`` (hypothesis has loaded it itself); without it,
    ``$HYPOTHESIS_PROFILE``, else ``ci`` under CI and ``dev`` elsewhere. Unless the profile is
    derandomized or ``force_seed`` is False (``--hypothesis-seed`` was given), hypothesis's
    randomness is tied to ``seed`` so that replaying the run's seed replays its examples too.
    Raises ``ValueError`` for an unknown ``$HYPOTHESIS_PROFILE``.
    """
    if "hypothesis" not in sys.modules:
        return None
    import hypothesis
    from hypothesis import settings

    chosen = hypothesis_profile_name(given, ci=ci)
    if given is None:
        try:
            settings.load_profile(chosen)
        except hypothesis.errors.InvalidArgument as exc:
            raise ValueError(f"$HYPOTHESIS_PROFILE: {exc}") from None
    if not settings().derandomize and force_seed:
        import hypothesis.core

        hypothesis.core.global_force_seed = seed  # type: ignore[assignment]  # typed None
    return chosen


NIGHTLY_EXAMPLES_FACTOR = 5
"""Under the ``nightly`` profile, a test that pins its own ``max_examples`` (a CI budget, e.g.
``@settings(max_examples=40)``) runs this many times as many examples, up to a quarter of
the profile's count: otherwise the pinned count overrides the profile and the nightly run
would repeat CI's examples count while claiming more."""


def nightly_examples(test_fn: object, profile: str | None) -> int | None:
    """Raise a pinned ``max_examples`` of the hypothesis test ``test_fn`` for the nightly
    profile (see :data:`NIGHTLY_EXAMPLES_FACTOR`); returns the new count, None when nothing
    changed (not a hypothesis test, not the nightly profile, the count follows the profile,
    or it is already at the cap, as a count derived from the profile is)."""
    if profile != "nightly" or "hypothesis" not in sys.modules:
        return None
    from hypothesis import settings

    pinned = getattr(test_fn, "_hypothesis_internal_use_settings", None)
    if not isinstance(pinned, settings) or pinned is settings.default:
        return None  # not a hypothesis test, or its count already is the profile's
    if getattr(test_fn, "_harness_nightly_examples", False):
        return None  # raised once already (parametrized tests share one function)
    test_fn._harness_nightly_examples = True  # type: ignore[attr-defined]
    cap = settings().max_examples // 4  # the loaded profile's count
    wanted = min(pinned.max_examples * NIGHTLY_EXAMPLES_FACTOR, cap)
    if wanted <= pinned.max_examples:
        return None
    test_fn._hypothesis_internal_use_settings = settings(pinned, max_examples=wanted)  # type: ignore[attr-defined]
    return wanted
