"""`harness init` over other teams' layouts: it finds the tests and the configuration file,
writes the tier mapping without moving a file, and the plugin then reads it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import layout, tiers
from harness.cli import main

PASSING = "def test_ok():\n    pass\n"


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def _init(root: Path, monkeypatch: pytest.MonkeyPatch, *args: str):
    monkeypatch.chdir(root)
    return CliRunner().invoke(main, ["init", *args], catch_exceptions=False)


def _tier(root: Path, rel: str) -> str | None:
    found = layout.read(root)
    return tiers.tier_of(tiers.project_tiers(root), found.suites_dir, rel)


@pytest.mark.parametrize(
    ("files", "config", "marker"),
    [
        # pyproject.toml: [tool.harness], beside the project's own tables.
        ({"pyproject.toml": "[project]\nname = 'p'\n"}, "pyproject.toml", "[tool.harness]"),
        # A setup.py project with its pytest options in setup.cfg: a [harness] section there.
        ({"setup.cfg": "[tool:pytest]\naddopts = -ra\n"}, "setup.cfg", "[harness]"),
        (
            {"tox.ini": "[tox]\nenvlist = py311\n\n[pytest]\naddopts = -ra\n"},
            "tox.ini",
            "[harness]",
        ),
        # Nothing at all: setup.cfg, which pytest does not take as its configuration without a
        # [tool:pytest] section (a new pytest.ini would hide a tox.ini's options).
        ({}, "setup.cfg", "[harness]"),
    ],
)
def test_init_maps_a_flat_tests_folder_to_a_tier_in_the_file_the_project_already_has(
    tmp_path, monkeypatch, files, config, marker
):
    root = _write(tmp_path, {**files, "tests/test_a.py": PASSING, "tests/unit/test_u.py": PASSING})
    before = {p: p.read_text() for p in root.rglob("*.py")}
    result = _init(root, monkeypatch)
    assert result.exit_code == 0, result.output
    assert marker in (root / config).read_text()
    assert f"wrote {config}" in result.output
    assert {p: p.read_text() for p in root.rglob("*.py")} == before  # nothing moved
    assert (root / "quarantine.toml").is_file()
    assert layout.read(root).suites_dir == "tests"
    assert _tier(root, "tests/test_a.py") == "tests"
    assert _tier(root, "tests/unit/test_u.py") == "unit"


def test_init_refuses_a_project_without_tests_and_one_already_configured(tmp_path, monkeypatch):
    result = _init(_write(tmp_path / "a", {"src/x.py": ""}), monkeypatch)
    assert result.exit_code == 2 and "no test folder with test files" in result.output
    root = _write(tmp_path / "b", {"tests/test_a.py": PASSING, "pyproject.toml": ""})
    assert _init(root, monkeypatch).exit_code == 0
    again = _init(root, monkeypatch)
    assert again.exit_code == 2 and "already configured" in again.output


def test_init_dry_run_writes_nothing(tmp_path, monkeypatch):
    root = _write(tmp_path, {"test/test_a.py": PASSING, "pyproject.toml": "[project]\n"})
    result = _init(root, monkeypatch, "--dry-run")
    assert result.exit_code == 0 and "test folder: test/" in result.output
    assert (root / "pyproject.toml").read_text() == "[project]\n"
    assert not (root / "quarantine.toml").exists()


def test_init_with_workflow_writes_a_caller_of_the_reusable_tiers_workflow_for_its_tiers(
    tmp_path, monkeypatch
):
    import yaml

    root = _write(tmp_path, {"tests/test_a.py": PASSING, "tests/unit/test_u.py": PASSING})
    result = _init(root, monkeypatch, "--workflow", "acme/ml-harness@0123abcd")
    assert result.exit_code == 0, result.output
    caller = yaml.safe_load((root / ".github/workflows/harness.yml").read_text())
    job = caller["jobs"]["tests"]
    assert job["uses"] == "acme/ml-harness/.github/workflows/harness-tiers.yml@0123abcd"
    assert job["with"]["tiers"] == "unit,tests"
    assert "ml-harness[ci,history]" in job["with"]["install"]


def test_init_refuses_a_bad_workflow_source_or_an_existing_workflow_and_writes_nothing(
    tmp_path, monkeypatch
):
    root = _write(tmp_path, {"tests/test_a.py": PASSING})
    result = _init(root, monkeypatch, "--workflow", "ml-harness")
    assert result.exit_code == 2 and "OWNER/REPO@COMMIT_SHA" in result.output
    assert not (root / "setup.cfg").exists() and not (root / ".github").exists()
    _write(root, {".github/workflows/harness.yml": "name: ours\n"})
    result = _init(root, monkeypatch, "--workflow", "acme/ml-harness@v1")
    assert result.exit_code == 2 and "not overwritten" in result.output
    assert (root / ".github/workflows/harness.yml").read_text() == "name: ours\n"
    assert not (root / "setup.cfg").exists()
