"""The MLflow side of the tracking benchmark (bench.py): the same workloads, in MLflow's own
interpreter.

MLflow is never a dependency of this project, so its workloads are a self-contained script
(:data:`MLFLOW_SCRIPT`: the standard library, numpy and mlflow only) that
:func:`measure_mlflow` runs with ``--mlflow-python`` and whose one ``RESULT {json}`` line it
reads back. Keep the script's workloads in step with bench.py's: the comparison is only fair
while both sides do the same work.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["MLFLOW_SCRIPT", "measure_mlflow"]

MLFLOW_SCRIPT = r"""
import json, os, shutil, sqlite3, statistics, sys, time, uuid
import numpy as np
cfg = json.loads(sys.argv[1])
work = cfg["workdir"]
os.environ["MLFLOW_TRACKING_URI"] = "sqlite:///" + os.path.join(work, "mlflow.db")
import mlflow
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])
client = MlflowClient()
def exp(name):
    e = client.get_experiment_by_name(name)
    if e:
        return e.experiment_id
    where = os.path.join(work, "mlartifacts", name)
    return client.create_experiment(name, artifact_location=where)
out = {"mlflow_version": mlflow.__version__}
# metric logging: log_batch of 1,000 metrics per call
keys = 10
steps = cfg["points"] // keys
rates = []
cpu_rates = []
for _ in range(cfg["repeats"]):
    run = client.create_run(exp("log"))
    rid = run.info.run_id
    t0 = time.perf_counter()
    c0 = time.process_time()
    batch = []
    for step in range(steps):
        ts = int(time.time() * 1000)
        for k in range(keys):
            batch.append(Metric(f"m{k}", step * 0.001, ts, step))
        if len(batch) >= 1000:
            client.log_batch(rid, metrics=batch)
            batch = []
    if batch:
        client.log_batch(rid, metrics=batch)
    rates.append(steps * keys / (time.perf_counter() - t0))
    cpu_rates.append(steps * keys / (time.process_time() - c0))
    client.set_terminated(rid)
out["log_points_per_s"] = statistics.median(rates)
out["log_points_per_cpu_s"] = statistics.median(cpu_rates)
# one log_metric call
run = client.create_run(exp("log"))
t0 = time.perf_counter()
for s in range(50):
    client.log_metric(run.info.run_id, "x", 1.0, step=s)
out["one_log_metric_ms"] = (time.perf_counter() - t0) / 50 * 1000
# run creation: 20 params, 5 metrics, ended
rates = []
cpu_rates = []
params = {f"p{i}": (i * 0.5 if i % 2 else f"v{i}") for i in range(20)}
for _ in range(cfg["repeats"]):
    t0 = time.perf_counter()
    c0 = time.process_time()
    create_exp = exp("create")
    for _ in range(cfg["runs"]):
        with mlflow.start_run(experiment_id=create_exp):
            mlflow.log_params(params)
            mlflow.log_metrics({f"m{i}": float(i) for i in range(5)}, step=0)
    rates.append(cfg["runs"] / (time.perf_counter() - t0))
    cpu_rates.append(cfg["runs"] / (time.process_time() - c0))
out["runs_per_s"] = statistics.median(rates)
out["runs_per_cpu_s"] = statistics.median(cpu_rates)
# search: clone one template run's rows n times with the same data the tracker gets
eid = exp("search")
tmpl = client.create_run(eid)
tid = tmpl.info.run_id
client.log_batch(
    tid,
    metrics=[Metric("val_acc", 0.5, 0, 100), Metric("loss", 0.5, 0, 100)],
    params=[Param("lr", "0.001"), Param("layers", "1"), Param("batch", "32"),
            Param("opt", "adam"), Param("data", "mnist")],
)
client.set_tag(tid, "team", "nlp")
client.set_terminated(tid)
db = sqlite3.connect(os.path.join(work, "mlflow.db"))
def rows(table, col="run_uuid"):
    cur = db.execute(f"SELECT * FROM {table} WHERE {col} = ?", (tid,))
    return [d[0] for d in cur.description], cur.fetchall()
rng = np.random.default_rng(cfg["seed"])
n = cfg["search_n"]
t0 = time.perf_counter()
for start in range(0, n, 20000):
    m = min(20000, n - start)
    ids = [uuid.UUID(int=int(x)).hex for x in rng.integers(0, 2**62, m)]
    created = time.time() - rng.uniform(0, 90 * 86400, m)
    acc = rng.random(m); loss = rng.random(m); lr = 10 ** rng.uniform(-5, -1, m)
    for table in ("runs", "params", "metrics", "latest_metrics", "tags"):
        cols, template = rows(table)
        new = []
        for j, i in enumerate(ids):
            for r in template:
                d = dict(zip(cols, r))
                d["run_uuid"] = i
                if table == "runs":
                    d["name"] = i[:8]
                    d["start_time"] = int(created[j] * 1000)
                    d["end_time"] = d["start_time"] + 60000
                    if "artifact_uri" in d:
                        d["artifact_uri"] = d["artifact_uri"].replace(tid, i)
                if table in ("metrics", "latest_metrics"):
                    d["value"] = float(acc[j] if d["key"] == "val_acc" else loss[j])
                if table == "params" and d["key"] == "lr":
                    d["value"] = repr(float(lr[j]))
                if table == "params" and d["key"] == "layers":
                    d["value"] = str(j % 8)
                if table == "tags" and d["key"] == "team":
                    d["value"] = "nlp" if j % 2 else "cv"
                new.append(tuple(d[c] for c in cols))
        marks = ", ".join("?" * len(cols))
        db.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})", new)
    db.commit()
out["search_build_s"] = time.perf_counter() - t0
times = []
cpu = []
found = 0
for _ in range(cfg["search_repeats"]):
    t0 = time.perf_counter()
    c0 = time.process_time()
    res = client.search_runs(
        [eid], "metrics.val_acc > 0.85", order_by=["metrics.val_acc DESC"], max_results=100
    )
    times.append((time.perf_counter() - t0) * 1000)
    cpu.append((time.process_time() - c0) * 1000)
    found = len(res)
times.sort()
out["search_p50_ms"] = statistics.median(times)
out["search_p90_ms"] = times[int(0.9 * (len(times) - 1))]
out["search_cpu_p50_ms"] = statistics.median(cpu)
out["search_found"] = found
# artifacts: the same file logged to three runs
src = cfg["artifact"]
if src:
    art_exp = exp("art")
    took = []
    for r in range(3):
        with mlflow.start_run(experiment_id=art_exp):
            t0 = time.perf_counter()
            mlflow.log_artifact(src)
            took.append(time.perf_counter() - t0)
    out["artifact_MBps"] = os.path.getsize(src) / 1048576 * 1.048576 / statistics.median(took)
    out["artifact_stored_bytes_for_3_runs"] = sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, fs in os.walk(os.path.join(work, "mlartifacts", "art"))
        for f in fs
    )
print("RESULT " + json.dumps(out))
"""


def measure_mlflow(python: str, workdir: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [python, "-c", MLFLOW_SCRIPT, json.dumps({**cfg, "workdir": str(workdir)})],
        cwd=workdir,  # anything MLflow writes by default (./mlruns) stays in the temp dir
        capture_output=True,
        text=True,
        timeout=3600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(
            f"the MLflow workload failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result
