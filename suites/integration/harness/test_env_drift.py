"""`harness env check` against a real virtual environment that has drifted from its lock.

A fresh venv (no --system-site-packages) gets the harness's declared runtime dependencies at
the versions of requirements/cpu.lock, then an older iniconfig than the lock pins. The harness
source is made importable with a .pth file, not installed, so the venv's distributions are
exactly what pip put there. Needs the package index (PyPI), as `make venv` does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
LOCKED = "2.3.1"  # iniconfig in requirements/cpu.lock
INSTALLED = "2.1.0"  # an older release on PyPI, pure Python


def run(argv: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=300, **kwargs
    )


@pytest.fixture(scope="module")
def drifted_venv(tmp_path_factory) -> Path:
    """A venv with the harness's dependencies and iniconfig==INSTALLED; returns its python."""
    root = tmp_path_factory.mktemp("drift")
    made = run([sys.executable, "-m", "venv", root / "venv"])
    assert made.returncode == 0, made.stderr
    python = root / "venv" / "bin" / "python"

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for step in (
        [*pip, "-c", REPO / "requirements" / "cpu.lock", *deps],
        [*pip, f"iniconfig=={INSTALLED}"],
    ):
        done = run(step)
        if done.returncode != 0:
            pytest.fail(f"pip failed ({' '.join(map(str, step))}):\n{done.stderr[-3000:]}")

    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    (Path(site.stdout.strip()) / "ml_harness_source.pth").write_text(f"{REPO}\n")
    return python


def frozen_lock(python: Path, path: Path, *, iniconfig: str) -> Path:
    """The venv's own `pip freeze --all` as a lock, with iniconfig pinned to ``iniconfig``."""
    freeze = run([python, "-m", "pip", "freeze", "--all", "--disable-pip-version-check"])
    assert freeze.returncode == 0, freeze.stderr
    pins = [
        f"iniconfig=={iniconfig}" if line.lower().startswith("iniconfig==") else line
        for line in freeze.stdout.splitlines()
    ]
    assert f"iniconfig=={iniconfig}" in pins
    path.write_text("# written by test_env_drift.py\n" + "\n".join(pins) + "\n")
    return path


def env_check(python: Path, lock: Path, *extra: str) -> subprocess.CompletedProcess:
    # cwd outside the repo: the venv's .pth, not the working directory, must provide harness.
    argv = [python, "-m", "harness.cli", "env", "check", "--lock", lock, *extra]
    return run(argv, cwd=lock.parent)


def test_the_venv_matches_a_lock_of_what_it_holds(drifted_venv, tmp_path):
    lock = frozen_lock(drifted_venv, tmp_path / "same.lock", iniconfig=INSTALLED)
    result = env_check(drifted_venv, lock)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout


def test_a_venv_with_another_version_than_the_lock_fails_naming_both_versions(
    drifted_venv, tmp_path
):
    lock = frozen_lock(drifted_venv, tmp_path / "drift.lock", iniconfig=LOCKED)
    result = env_check(drifted_venv, lock)
    assert result.returncode == 1, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if "iniconfig" in line)
    assert INSTALLED in row and f"=={LOCKED}" in row

    as_json = env_check(drifted_venv, lock, "--json")
    assert as_json.returncode == 1
    report = json.loads(as_json.stdout)
    assert report["wrong_version"] == [
        {"name": "iniconfig", "installed": INSTALLED, "wanted": f"=={LOCKED}"}
    ]
    assert report["missing"] == [] and report["extra"] == []


def test_an_installed_package_the_lock_does_not_name_is_extra(drifted_venv, tmp_path):
    lock = frozen_lock(drifted_venv, tmp_path / "short.lock", iniconfig=INSTALLED)
    pins = [line for line in lock.read_text().splitlines() if not line.startswith("mdurl==")]
    lock.write_text("\n".join(pins) + "\n")
    result = env_check(drifted_venv, lock, "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    assert [p["name"] for p in json.loads(result.stdout)["extra"]] == ["mdurl"]
