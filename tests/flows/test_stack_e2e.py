"""``arl pipeline up`` / ``down``: the local stack in one command, and stopped by the pids it recorded.

Slow (two servers, a worker and ``prefect deploy --all``: minutes on busy cores); `-m "not slow"` skips it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _arl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("arl"))
    return subprocess.run(
        [exe, "pipeline", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=420
    )


def test_up_starts_servers_worker_and_deployments_and_down_stops_them(tmp_path: Path) -> None:
    home = tmp_path / "arl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "ARL_"))}
    env["ARL_HOME"] = str(home)
    pp, mp = _free_port(), _free_port()
    up = _arl("up", "--prefect-port", str(pp), "--mlflow-port", str(mp), env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert (
            f"Prefect UI: http://127.0.0.1:{pp}" in up.stdout
            and f"MLflow UI:  http://127.0.0.1:{mp}" in up.stdout
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{mp}/health", timeout=10) as r:
            assert r.status == 200
        req = urllib.request.Request(
            f"http://127.0.0.1:{pp}/api/deployments/filter",
            data=b"{}",
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            names = {d["name"] for d in json.loads(r.read())}
        assert names == {"offline-to-online", "retrain-on-new-data", "ingest", "dataset-watcher"}
        pids = [
            p["pid"] for p in json.loads((home / "stack" / "state.json").read_text())["processes"].values()
        ]
        assert len(pids) == 3
    finally:
        down = _arl("down", env=env)
    assert down.returncode == 0 and "stopped: worker, mlflow, prefect" in down.stdout
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not (home / "stack" / "state.json").exists()
