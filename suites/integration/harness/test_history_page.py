"""The tests page (`harness history page`), rendered by headless Chromium with no network: the
checks read what Chromium rendered (the DOM, a screenshot's pixels), not the HTML written."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from screenshots import count_pixels

from harness.cli import main
from harness.history.page import COLORS
from harness.history.records import Outcome, RunRecord, TestResult
from harness.history.store import open_store

CHROMIUM = next(
    filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed: apt-get install -y chromium (.ci/run installs it)",
)
SQUARE_PX = 9 * 18  # .sq in the page's style sheet


def _chromium(url: str, tmp_path: Path, *args: str) -> str:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--proxy-server=http://127.0.0.1:9",
        "--force-device-scale-factor=1",
        "--window-size=1400,600",
        *args,
        url,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _count(path: Path, hex_color: str, tolerance: int = 6) -> int:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return count_pixels(path, (r, g, b), tolerance)


@pytest.fixture
def page(tmp_path: Path) -> Path:
    """12 runs of three tests: broken (6 failures), flaky (2), healthy (0): 8 red squares."""
    db = str(tmp_path / "h.db")
    with open_store(db) as store:
        for r in range(12):
            outcomes = {
                "t.py::test_broken": "failed" if r >= 6 else "passed",
                "t.py::test_flaky": "failed" if r in (3, 8) else "passed",
                "t.py::test_fine": "passed",
            }
            store.append(
                RunRecord(
                    f"r{r}",
                    float(r),
                    "harness",
                    [TestResult(n, o, 0.25, 100 + r) for n, o in outcomes.items()],
                    commit=f"{r // 2:040x}",
                    tree=f"{r // 2:040x}",
                    runner="cpu-1",
                    seed=4000 + r,
                )
            )
    out = tmp_path / "site" / "tests.html"
    result = CliRunner().invoke(main, ["history", "page", "--db", db, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_the_tests_page_lists_a_row_per_test_most_disruptive_first(
    page: Path, tmp_path: Path
) -> None:
    dom = _chromium(page.as_uri(), tmp_path, "--dump-dom")
    order = [dom.index(f"t.py::test_{name}</code>") for name in ("broken", "flaky", "fine")]
    assert order == sorted(order)
    assert dom.count('class="sq ') == 36
    # The flaky test's last failure: run 8, replayed by its run's seed.
    assert "pytest t.py::test_flaky --harness-seed=4008" in dom


def test_the_outcome_strips_render_one_coloured_square_per_run(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    _chromium(page.as_uri(), tmp_path, f"--screenshot={shot}")
    failed = _count(shot, COLORS[Outcome.FAIL])
    passed = _count(shot, COLORS[Outcome.PASS])
    assert 0.9 * 8 * SQUARE_PX <= failed <= 1.1 * 8 * SQUARE_PX, failed
    assert 0.9 * 28 * SQUARE_PX <= passed <= 1.1 * 28 * SQUARE_PX, passed
