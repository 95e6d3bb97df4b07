"""Fixtures shared by the suites.

Testing the harness from the outside: write a project, run pytest on it.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

# Triton decides between compiling and interpreting when a function is *defined*, and its own
# standard library (tl.cdiv, tl.max, ...) is defined when triton is first imported. Any test
# module may import triton (directly or through torch), in any order, so on a machine without
# a GPU the interpreter is switched on here, before any test module is imported.
if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        if "triton" in sys.modules:
            raise pytest.UsageError(
                "triton was imported before suites/conftest.py could switch on its interpreter "
                "(this machine has no GPU), so its kernels cannot run here: set "
                "TRITON_INTERPRET=1 in the environment, or stop the plugin or -p module that "
                "imports triton at start-up"
            )
        os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def _torch_inductor_imported() -> None:
    """An in-process run under CI turns deterministic mode on, whose first torch call imports
    ``torch._inductor``. pytester then drops the modules the inner run imported, and importing
    them again in this process registers torch's test operator library a second time: an
    error in whichever later test switches determinism, depending on test order (xdist,
    shards). So when torch is loaded, that import happens out here, once."""
    if "torch" in sys.modules:
        import torch._inductor.config  # noqa: F401


@pytest.fixture
def project(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, _torch_inductor_imported: None
) -> Callable[..., Path]:
    """Write files (dedented) into the pytester directory.

    ``project({"suites/unit/test_a.py": src})``.

    The inner runs start outside CI unless a test sets ``CI`` itself, and with no seed from the
    environment, so the outer run's settings never leak in.
    """
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("HARNESS_SEED", raising=False)
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    # An outer run's test history: a nested harness run must not append to it.
    monkeypatch.delenv("HARNESS_HISTORY_DB", raising=False)
    # hypothesis detects CI by these too and would then change its own defaults.
    for var in (
        "GITHUB_ACTIONS",
        "TF_BUILD",
        "BUILDKITE",
        "CIRCLECI",
        "CODEBUILD_BUILD_ID",
        "GITLAB_CI",
        "JENKINS_URL",
    ):
        monkeypatch.delenv(var, raising=False)

    def write(files: dict[str, str]) -> Path:
        for rel, src in files.items():
            path = pytester.path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(src).lstrip("\n"))
        return pytester.path

    return write


@pytest.fixture(autouse=True)
def _restore_hypothesis_profile():
    """In-process pytester runs load a hypothesis profile and may force a seed: both are
    process-global, so put the outer run's back afterwards."""
    try:
        import hypothesis.core
        from hypothesis import settings
    except ImportError:
        yield
        return
    profile, forced = settings.get_current_profile_name(), hypothesis.core.global_force_seed
    yield
    settings.load_profile(profile)
    hypothesis.core.global_force_seed = forced


def _quarantine_entry(
    test: str,
    *,
    added: dt.date | None = None,
    expires: dt.date | None = None,
    reason: str = "fails about 1 in 50 on the GPU runner",
) -> str:
    added = added or dt.date.today()
    expires = expires or added + dt.timedelta(days=30)
    return (
        "[[quarantine]]\n"
        f'test = "{test}"\n'
        f'reason = "{reason}"\n'
        'issue = "https://github.com/ORG/REPO/issues/123"\n'
        f"added = {added.isoformat()}\n"
        f"expires = {expires.isoformat()}\n"
    )


@pytest.fixture
def quarantine_entry() -> Callable[..., str]:
    """A function rendering one valid ``[[quarantine]]`` entry (dates default to today + 30)."""
    return _quarantine_entry
