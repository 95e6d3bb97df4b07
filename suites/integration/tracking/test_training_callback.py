"""The training loop recorded through the tracking callback: params from the config, the
loop's metrics rows as metric series, checkpoints as artifacts; the loop imports nothing
of tracking."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from reference_impls.tracking.callback import TrackingCallback, flatten
from reference_impls.tracking.client import Tracker
from reference_impls.training.config import TrainConfig
from reference_impls.training.loop import Trainer

TRAINING = Path(__file__).resolve().parents[3] / "reference_impls" / "training"


def test_the_training_package_never_imports_tracking():
    for path in TRAINING.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any("tracking" in n for n in names), f"{path.name} imports {names}"


def test_a_training_run_is_recorded_with_params_metrics_and_checkpoints(tmp_path):
    config = TrainConfig(max_steps=12, val_every_steps=4, progress=False, num_threads=1)
    tracker = Tracker(tmp_path / "t.db", tmp_path / "artifacts", flush_interval_s=0.1)
    callback = TrackingCallback(tracker, "regression", config, name="cb-run", git_commit="abc")
    run_dir = tmp_path / "run"
    result = Trainer(config, run_dir, callbacks=[callback]).run()
    callback.finish(result)
    assert callback.run is not None
    info = tracker.get_run(callback.run.id)
    assert info.status == "finished" and info.name == "cb-run"
    assert info.params == flatten(config.to_dict())
    assert isinstance(info.params["optimizer.lr"], float)
    assert info.tags["stop_reason"] == "max_steps"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [(r["step"], r["loss"]) for r in rows if r["kind"] == "train"]
    val = [(r["step"], r["val_loss"]) for r in rows if r["kind"] == "val"]
    backend = tracker.backend
    assert [(s, v) for s, v, _ in backend.metric_history(info.id, "loss")] == train
    assert [(s, v) for s, v, _ in backend.metric_history(info.id, "val_loss")] == val
    assert [s for s, _ in val] == [4, 8, 12]
    names = [a.name for a in backend.artifacts(info.id)]
    assert "checkpoints/final.pt" in names
    assert any(n.startswith("checkpoints/best-step") for n in names)
    final = backend.download_artifact(info.id, "checkpoints/final.pt", tmp_path / "final.pt")
    assert final.read_bytes() == (run_dir / "latest.pt").read_bytes()
    graph = tracker.lineage(f"run:{info.id}", "forward")
    assert len([n for n in graph.nodes if n.startswith("artifact:")]) == len(
        {a.sha256 for a in backend.artifacts(info.id)}
    )
    assert "code:abc" in tracker.lineage(f"run:{info.id}").nodes
