"""``arl pipeline up`` / ``down``: the local stack in one command, secured, and stopped by the pids it
recorded.

One stack (with MLflow's basic-auth app) serves the whole module: unauthenticated, cross-site and
foreign-origin requests are refused, while the CLI, the worker and a deployment's run get in through the
stack's env mapping. Slow (two servers, a worker and ``prefect deploy --all``: minutes on busy cores);
`-m "not slow"` skips it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from stack_support import arl, basic, call, free_port, run

from tasks.settings import state_paths
from tasks.stack import credentials_file, read_credentials, running_urls, stack_env

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
DEPLOYMENTS = {"offline-to-online", "retrain-on-new-data", "ingest", "dataset-watcher"}
FOREIGN = "http://evil.example"


@dataclass
class Stack:
    home: Path
    env: dict[str, str]
    up: subprocess.CompletedProcess
    prefect: str
    mlflow: str

    def client_env(self) -> dict[str, str]:
        """A clean environment plus the stack's env mapping: what the CLI and the worker get."""
        paths = state_paths(self.home)
        return {**self.env, **stack_env(paths, running_urls(paths))}

    @property
    def auth(self) -> str:
        return basic(read_credentials(state_paths(self.home))["PREFECT_API_AUTH_STRING"])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("stack") / "arl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "ARL_"))}
    env["ARL_HOME"] = str(home)
    pp, mp = free_port(), free_port()
    up = arl("up", "--prefect-port", str(pp), "--mlflow-port", str(mp), "--mlflow-auth", env=env)
    try:
        yield Stack(home, env, up, f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{mp}")
    finally:
        arl("down", env=env)


def test_up_starts_the_stack_and_names_the_credentials_file_not_its_values(stack: Stack) -> None:
    out = stack.up.stdout + stack.up.stderr
    assert stack.up.returncode == 0, out
    assert f"Prefect UI: {stack.prefect}" in out and f"MLflow UI:  {stack.mlflow}" in out
    creds_path = credentials_file(state_paths(stack.home))
    assert str(creds_path) in out
    assert stat.S_IMODE(creds_path.stat().st_mode) == 0o600
    secrets = read_credentials(state_paths(stack.home)).values()
    assert len(secrets) == 3  # Prefect's auth string, MLflow's user and password
    written = [out] + [p.read_text() for p in (stack.home / "stack").glob("*") if p != creds_path]
    assert not [s for s in secrets if len(s) > 3 and any(s in text for text in written)]
    with urllib.request.urlopen(f"{stack.mlflow}/health", timeout=10) as r:
        assert r.status == 200


def test_prefect_refuses_requests_without_the_auth_string(stack: Stack) -> None:
    version = f"{stack.prefect}/api/admin/version"
    assert call(version)[0] == 401
    assert call(version, Authorization=basic("arl:guessed"))[0] == 401
    assert call(f"{stack.prefect}/api/csrf-token?client=x")[0] == 401  # no token for strangers either
    assert call(version, Authorization=stack.auth)[0] == 200
    assert call(f"{stack.prefect}/api/health")[0] == 200  # the probe stays open


def _csrf_token(stack: Stack, client: str) -> str:
    status, _, body = call(f"{stack.prefect}/api/csrf-token?client={client}", Authorization=stack.auth)
    assert status == 200, body
    return json.loads(body)["token"]


def test_prefect_refuses_a_write_without_its_csrf_token(stack: Stack) -> None:
    url, client = f"{stack.prefect}/api/deployments/filter", str(uuid.uuid4())
    json_body = {"Content-Type": "application/json", "Authorization": stack.auth}
    for extra in ({"Origin": FOREIGN}, {"Prefect-Csrf-Token": "forged", "Prefect-Csrf-Client": client}):
        status, headers, _ = call(url, "POST", b"{}", **json_body, **extra)
        assert status == 403 and headers.get("access-control-allow-origin") != FOREIGN
    token = _csrf_token(stack, client)
    status, _, body = call(
        url, "POST", b"{}", **json_body, **{"Prefect-Csrf-Token": token, "Prefect-Csrf-Client": client}
    )
    assert status == 200, body
    assert {d["name"] for d in json.loads(body)} == DEPLOYMENTS


def test_cors_answers_the_ui_origin_only(stack: Stack) -> None:
    version = f"{stack.prefect}/api/admin/version"
    for headers in ({"Origin": FOREIGN}, {"Origin": FOREIGN, "Host": "evil.example"}):
        for auth in ({}, {"Authorization": stack.auth}):
            allowed = call(version, **headers, **auth)[1].get("access-control-allow-origin")
            assert allowed is None, (headers, auth, allowed)
    status, headers, _ = call(
        f"{stack.prefect}/api/deployments/filter", "OPTIONS", None, Origin=FOREIGN,
        **{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"},
    )  # fmt: skip
    assert status != 200 and "access-control-allow-origin" not in headers
    own = call(version, Origin=stack.prefect, Authorization=stack.auth)[1]
    assert own.get("access-control-allow-origin") == stack.prefect


def test_mlflow_refuses_strangers_and_the_stack_clients_get_in(stack: Stack) -> None:
    search = f"{stack.mlflow}/api/2.0/mlflow/experiments/search?max_results=1"
    assert call(search)[0] == 401
    assert call(search, Authorization=basic("arl:guessed"))[0] == 401
    compare = run("arl", "compare", "--task", "safe-pendulum", env=stack.env)  # reads the stack itself
    assert compare.returncode == 0 and "no pipeline runs" in compare.stdout, compare.stdout + compare.stderr
    code = "import mlflow; print(mlflow.MlflowClient().create_experiment('arl-stack-check'))"
    created = run("python", "-c", code, env=stack.client_env())
    assert created.returncode == 0, created.stderr[-2000:]


def test_a_deployment_run_through_the_worker_completes(stack: Stack) -> None:
    ran = run("prefect", "deployment", "run", "dataset-watcher/dataset-watcher", env=stack.client_env())
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", ran.stdout).group(1)
    deadline, state = time.monotonic() + 300, None
    while time.monotonic() < deadline:
        body = call(f"{stack.prefect}/api/flow_runs/{run_id}", Authorization=stack.auth)[2]
        state = json.loads(body)["state"]
        if state and state["type"] in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
            break
        time.sleep(3)
    log = (stack.home / "stack" / "worker.log").read_text()[-3000:]
    assert state and state["type"] == "COMPLETED", f"{state}; worker log:\n{log}"


def test_down_stops_every_process_and_keeps_the_credentials(stack: Stack) -> None:
    state = json.loads((stack.home / "stack" / "state.json").read_text())
    pids = [p["pid"] for p in state["processes"].values()]
    assert len(pids) == 3
    down = arl("down", env=stack.env)
    assert down.returncode == 0 and "stopped: worker, mlflow, prefect" in down.stdout
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not (stack.home / "stack" / "state.json").exists()
    assert credentials_file(state_paths(stack.home)).is_file()
