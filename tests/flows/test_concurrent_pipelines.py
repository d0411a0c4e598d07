"""Two pipeline runs at once on one fresh home (one data repo, one MLflow store, one runs folder): both end,
the data repo is initialised once, and no checkpoint's logs are written twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flow_data import GATE, TINY, write_pendulum
from stack_support import ROOT

pytestmark = pytest.mark.e2e
RUN = """
import json, os, sys, time
from pathlib import Path
from flows.ingest import ingest_flow
from flows.offline_to_online import offline_to_online_flow
from flows.params import DatasetRef, GateConfig, IngestSource, TrainingConfig

source, training, gate = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
barrier = Path(sys.argv[4])
(barrier / str(os.getpid())).touch()
while len(list(barrier.iterdir())) < 2:  # both processes start their flows together
    time.sleep(0.01)
v = ingest_flow(IngestSource(kind="import", task="safe-pendulum", source=source, format="arl", name="tiny"),
                emit_event=False)
result = offline_to_online_flow(DatasetRef(path=v["path"], version=v["md5"]), TrainingConfig(**training),
                                GateConfig(**gate))
print(json.dumps(result["decision"]))
"""


def _unique(path: Path, key: str) -> bool:
    values = [json.loads(line)[key] for line in path.read_text().splitlines() if line]
    return len(values) == len(set(values))


def test_two_pipelines_at_once_on_one_home(prefect_server: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_server,
        "ARL_HOME": str(home),
        "ARL_DATA_REPO": str(home / "data"),
        "ARL_DVC_REMOTE": str(tmp_path / "remote"),
        "ARL_RUNS_DIR": str(home / "runs"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "ARL_MLFLOW_ARTIFACTS": str(tmp_path / "mlartifacts"),
        "OMP_NUM_THREADS": "1",
    }
    src = write_pendulum(tmp_path / "src" / "tiny")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    args = [sys.executable, "-c", RUN, str(src), json.dumps(TINY), json.dumps(GATE), str(barrier)]
    procs = [
        subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    decisions = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert {d["alias"] for d in decisions} <= {"champion", "challenger"}
    assert any(d["alias"] == "champion" for d in decisions)
    log = subprocess.run(
        ["git", "-C", str(home / "data"), "log", "--format=%s"], capture_output=True, text=True
    )
    assert log.stdout.splitlines()[-1] == "Initialise DVC" and log.stdout.count("Initialise DVC") == 1
    logs = list((home / "runs").rglob("metrics.jsonl")) + list((home / "runs").rglob("episodes.jsonl"))
    assert logs
    for f in logs:
        assert _unique(f, "step" if f.name == "metrics.jsonl" else "episode"), f
    assert not list(home.rglob("*.tmp")) and not list(home.rglob("*.partial"))
