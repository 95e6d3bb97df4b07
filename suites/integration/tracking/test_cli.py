"""The command line: search, lineage, gc --dry-run then gc, import-report, users and roles.
Most calls go through ``main(argv)`` in this process (same code as ``python -m``); one call
checks the module entry point itself."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reference_impls.tracking.__main__ import main
from reference_impls.tracking.backend import EmbeddedBackend
from reference_impls.tracking.metadata import MetricPoint

DAY = 86_400.0
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def store(tmp_path: Path) -> dict[str, object]:
    db, art = tmp_path / "t.db", tmp_path / "artifacts"
    backend = EmbeddedBackend(db, art)
    now = time.time()
    ids = []
    for i, age in enumerate((1, 40, 400)):
        rid = backend.create_run(
            "p", name=f"r{i}", params={"lr": 10.0**-i}, created_at=now - age * DAY
        )
        backend.log_metrics(rid, [MetricPoint("acc", 0, 0.3 * i, now)])
        for k in range(2):
            (tmp_path / "f").write_bytes(f"{i}-{k}".encode() * 500)
            backend.log_artifact(rid, tmp_path / "f", f"ckpt{k}.pt", kind="checkpoint")
        ids.append(rid)
    backend.add_edges([("dataset:d@1", f"run:{ids[0]}", "input")])
    backend.close()
    return {"args": ["--db", str(db), "--artifacts", str(art)], "ids": ids, "art": art}


def _objects(art: Path) -> int:
    return len(list((art / "objects").glob("*/*")))


def test_search_prints_json_and_refuses_a_bad_filter(store, capsys):
    assert (
        main(
            [
                "search",
                *store["args"],
                "p",
                "metrics.acc > 0.2",
                "--order-by",
                "metrics.acc desc",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in out["runs"]] == ["r2", "r1"]
    assert main(["search", *store["args"], "p", "bogus > 1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: unknown field 'bogus'")


def test_lineage_prints_dot(store, capsys):
    assert (
        main(
            ["lineage", *store["args"], "dataset:d@1", "--direction", "forward", "--format", "dot"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        out.startswith("digraph lineage {") and f'"dataset:d@1" -> "run:{store["ids"][0]}"' in out
    )


def test_gc_dry_run_reports_what_gc_then_frees(store, capsys):
    common = [
        *store["args"],
        "--keep-all-days",
        "7",
        "--keep-last-runs",
        "1",
        "--delete-after-days",
        "90",
        "--soft-delete-grace-days",
        "0",
        "--upload-grace-s",
        "0",
        "--json",
    ]
    before = _objects(store["art"])
    assert main(["gc", "--dry-run", *common]) == 0
    captured = capsys.readouterr()
    dry = json.loads(captured.out)
    assert "would soft-delete 1 runs and 3 artifacts" in captured.err
    assert _objects(store["art"]) == before  # nothing changed
    assert dry["retention"]["bytes_freed"] == 3 * 1500  # three 1,500-byte checkpoints
    assert main(["gc", *common]) == 0
    real = json.loads(capsys.readouterr().out)
    assert real["collection"]["bytes_freed"] == dry["retention"]["bytes_freed"]
    assert _objects(store["art"]) == before - 3


def test_import_report_stores_a_harness_report_directory_as_a_run(store, tmp_path, capsys):
    reports = tmp_path / "reports"
    reports.mkdir()
    report = {
        "version": 1,
        "seed": 1234,
        "seed_source": "random",
        "deterministic": True,
        "ci": False,
        "hypothesis_profile": "dev",
        "started": "2026-12-01T10:00:00+00:00",
        "duration_s": 12.5,
        "exit_status": 1,
        "environment": {"python": "3.11.7", "git_commit": "deadbeef"},
        "tests": [
            {"nodeid": "a", "tier": "unit", "outcome": "passed"},
            {"nodeid": "b", "tier": "unit", "outcome": "failed"},
            {"nodeid": "c", "tier": "integration", "outcome": "passed"},
        ],
    }
    (reports / "report.json").write_text(json.dumps(report))
    (reports / "junit.xml").write_text("<testsuites/>")
    (reports / "summary.md").write_text("# summary\n")
    assert main(["import-report", *store["args"], str(reports)]) == 0
    run_id = capsys.readouterr().out.strip()
    backend = EmbeddedBackend(store["args"][1], store["args"][3])
    run = backend.get_run(run_id)
    assert run.status == "failed" and run.params["seed"] == 1234 and run.git_commit == "deadbeef"
    assert run.metrics == {
        "tests_passed": 2,
        "tests_failed": 1,
        "tests_total": 3,
        "unit.passed": 1,
        "unit.failed": 1,
        "integration.passed": 1,
        "duration_s": 12.5,
    }
    assert [a.name for a in backend.artifacts(run_id)] == ["junit.xml", "report.json", "summary.md"]
    assert [
        r.id
        for r in backend.search(
            "harness", "metrics.tests_failed > 0 and created > '2026-11-30'"
        ).runs
    ] == [run_id]
    assert main(["import-report", *store["args"], str(tmp_path)]) == 1
    assert "has no report.json" in capsys.readouterr().err


def test_users_roles_and_the_module_entry_point(store, capsys):
    assert main(["user-add", *store["args"], "ann"]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("trk_") and len(token) > 40
    assert main(["grant", *store["args"], "ann", "p", "reader"]) == 0
    assert main(["user-add", *store["args"], "ann"]) == 1
    assert "exists already" in capsys.readouterr().err
    proc = subprocess.run(
        [sys.executable, "-m", "reference_impls.tracking", "gc", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "--dry-run" in proc.stdout
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "reference_impls.tracking",
            "search",
            "--db",
            "postgresql://x@nowhere:1/db",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "required: project" in proc.stderr
