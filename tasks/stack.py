"""The local stack behind ``arl up`` / ``arl down``: a Prefect server (SQLite), an MLflow tracking server
(SQLite backend, local artifact store) and a process worker on the ``local`` pool.

Every process is started in its own session, recorded in ``<state>/stack/state.json`` with its pid, and
stopped by that pid (its process group) on ``arl down``; logs go to ``<state>/stack/*.log``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tasks.settings import StatePaths

POOL = "local"


@dataclass(frozen=True)
class StackUrls:
    prefect_api: str
    prefect_ui: str
    mlflow: str


def _bin(name: str) -> str:
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else (shutil.which(name) or name)


def _state_file(paths: StatePaths) -> Path:
    return paths.stack / "state.json"


def read_state(paths: StatePaths) -> dict | None:
    f = _state_file(paths)
    return json.loads(f.read_text()) if f.is_file() else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def running_urls(paths: StatePaths) -> StackUrls | None:
    """The URLs of a stack ``arl up`` started and that is still running, else None."""
    state = read_state(paths)
    if not state or not all(alive(p["pid"]) for p in state["processes"].values()):
        return None
    return StackUrls(**state["urls"])


def _wait_http(url: str, timeout: float, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited ({proc.returncode}); see {log}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s; see {log}")


def _start(name: str, args: list[str], env: dict[str, str], paths: StatePaths, cwd: Path) -> subprocess.Popen:
    log = paths.stack / f"{name}.log"
    with log.open("ab") as out:
        return subprocess.Popen(
            args, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stack_env(paths: StatePaths, urls: StackUrls) -> dict[str, str]:
    """What a process of the stack (and anything run against it) needs in its environment."""
    return {
        "PREFECT_HOME": str(paths.prefect_home),
        "PREFECT_API_URL": urls.prefect_api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_TRACKING_URI": urls.mlflow,
        "ARL_HOME": str(paths.home),
        "GX_ANALYTICS_ENABLED": "false",
    }


def up(
    paths: StatePaths,
    project_dir: Path,
    *,
    prefect_port: int = 4200,
    mlflow_port: int = 5000,
    deploy: bool = True,
    timeout: float = 180.0,
) -> StackUrls:
    """Start the servers and the worker, create the pool, register ``prefect.yaml``'s deployments."""
    if (urls := running_urls(paths)) is not None:
        return urls
    paths.stack.mkdir(parents=True, exist_ok=True)
    paths.prefect_home.mkdir(parents=True, exist_ok=True)
    paths.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
    urls = StackUrls(
        f"http://127.0.0.1:{prefect_port}/api",
        f"http://127.0.0.1:{prefect_port}",
        f"http://127.0.0.1:{mlflow_port}",
    )
    env = {**os.environ, **stack_env(paths, urls), "PWD": str(project_dir)}
    server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["prefect"] = _start(
            "prefect",
            [_bin("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
            server_env,
            paths,
            project_dir,
        )
        procs["mlflow"] = _start(
            "mlflow",
            [
                _bin("mlflow"),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(mlflow_port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{paths.home / 'mlflow.db'}",
                "--artifacts-destination",
                str(paths.mlflow_artifacts),
            ],
            env,
            paths,
            project_dir,
        )
        _wait_http(f"{urls.prefect_api}/health", timeout, procs["prefect"], paths.stack / "prefect.log")
        _wait_http(f"{urls.mlflow}/health", timeout, procs["mlflow"], paths.stack / "mlflow.log")
        subprocess.run(
            [_bin("prefect"), "work-pool", "create", POOL, "--type", "process", "--overwrite"],
            env=env,
            cwd=project_dir,
            check=True,
            capture_output=True,
        )
        procs["worker"] = _start(
            "worker",
            [_bin("prefect"), "worker", "start", "--pool", POOL, "--type", "process"],
            env,
            paths,
            project_dir,
        )
        _write_state(paths, procs, urls)
        if deploy:
            res = subprocess.run(
                [_bin("prefect"), "--no-prompt", "deploy", "--all"],
                env=env,
                cwd=project_dir,
                capture_output=True,
                text=True,
            )
            (paths.stack / "deploy.log").write_text(res.stdout + res.stderr)
            if res.returncode != 0:
                raise RuntimeError(f"prefect deploy failed; see {paths.stack / 'deploy.log'}")
    except BaseException:
        _write_state(paths, procs, urls)
        down(paths)
        raise
    return urls


def _write_state(paths: StatePaths, procs: dict[str, subprocess.Popen], urls: StackUrls) -> None:
    state = {
        "processes": {k: {"pid": p.pid, "args": p.args} for k, p in procs.items()},
        "urls": urls.__dict__,
    }
    _state_file(paths).write_text(json.dumps(state, indent=2, default=str))


def down(paths: StatePaths, timeout: float = 20.0) -> list[str]:
    """Stop what :func:`up` started (worker first), by the process-group ids it recorded."""
    state = read_state(paths)
    if state is None:
        return []
    stopped = []
    for name in ("worker", "mlflow", "prefect"):
        proc = state["processes"].get(name)
        if proc is None or not alive(proc["pid"]):
            continue
        pid = proc["pid"]
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + timeout
        while alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.2)
        if alive(pid):
            os.killpg(pid, signal.SIGKILL)
        stopped.append(name)
    _state_file(paths).unlink(missing_ok=True)
    return stopped


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
