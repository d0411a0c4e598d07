"""The local stack behind ``arl up`` / ``arl down``: a Prefect server (SQLite), an MLflow tracking server
(SQLite backend, local artifact store) and a process worker on the ``local`` pool.

Every process is started in its own session, recorded in ``<state>/stack/state.json`` with its pid, and
stopped by that pid (its process group) on ``arl down``; logs go to ``<state>/stack/*.log``.

The Prefect server asks for an API auth string (HTTP basic auth), checks a CSRF token on every state-changing
request and answers cross-origin requests only from its own UI. With ``mlflow_auth`` the MLflow server runs
its basic-auth app. The clients' credentials live in ``<state>/stack/credentials.env`` (mode 0600, shell
syntax, generated once and reused); :func:`stack_env` hands them to every process that talks to the stack.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
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
PREFECT_AUTH = "PREFECT_API_AUTH_STRING"
MLFLOW_USER = "MLFLOW_TRACKING_USERNAME"
MLFLOW_PASSWORD = "MLFLOW_TRACKING_PASSWORD"


@dataclass(frozen=True)
class StackUrls:
    prefect_api: str
    prefect_ui: str
    mlflow: str
    mlflow_auth: bool = False
    """Whether the MLflow server runs its basic-auth app (clients then send MLFLOW_TRACKING_USERNAME and
    MLFLOW_TRACKING_PASSWORD)."""


def _bin(name: str) -> str:
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else (shutil.which(name) or name)


def _state_file(paths: StatePaths) -> Path:
    return paths.stack / "state.json"


def credentials_file(paths: StatePaths) -> Path:
    """The clients' credentials of the stack: ``KEY=value`` lines that a shell can source
    (``set -a; . FILE``)."""
    return paths.stack / "credentials.env"


def mlflow_auth_db(paths: StatePaths) -> Path:
    """The basic-auth app's user store (its admin is created on the first start, with the stored password)."""
    return paths.home / "mlflow-auth.db"


def read_credentials(paths: StatePaths) -> dict[str, str]:
    f = credentials_file(paths)
    if not f.is_file():
        return {}
    pairs = (shlex.split(line)[0].split("=", 1) for line in f.read_text().splitlines() if line.strip())
    return {k: v for k, v in pairs}


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by its owner only (0600 from the first byte, replaced
    atomically)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def ensure_credentials(
    paths: StatePaths, auth_string: str | None = None, mlflow_auth: bool = False
) -> dict[str, str]:
    """The stored credentials, completed and saved: ``auth_string`` (else the stored one, else a new random
    one) for Prefect, and with ``mlflow_auth`` an MLflow user and password (kept once made, since the auth
    app's user store remembers the password it was first started with)."""
    creds = read_credentials(paths)
    if auth_string is not None:
        if not auth_string.strip():
            raise ValueError("the Prefect API auth string is empty")
        creds[PREFECT_AUTH] = auth_string
    creds.setdefault(PREFECT_AUTH, f"arl:{secrets.token_urlsafe(32)}")
    if mlflow_auth and MLFLOW_PASSWORD not in creds:
        if mlflow_auth_db(paths).exists():
            raise RuntimeError(
                f"{mlflow_auth_db(paths)} holds an MLflow admin whose password is not in "
                f"{credentials_file(paths)}: restore that file, or remove the user store to start with a "
                "new admin"
            )
        creds[MLFLOW_USER], creds[MLFLOW_PASSWORD] = "arl", secrets.token_urlsafe(32)
    _write_private(
        credentials_file(paths), "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(creds.items()))
    )
    return creds


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
    """What a process of the stack (and anything run against it) needs in its environment: the URLs and the
    clients' credentials (Prefect's auth string, MLflow's user and password when its auth app runs)."""
    creds = read_credentials(paths)
    env = {
        "PREFECT_HOME": str(paths.prefect_home),
        "PREFECT_API_URL": urls.prefect_api,
        "PREFECT_CLIENT_CSRF_SUPPORT_ENABLED": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_TRACKING_URI": urls.mlflow,
        "ARL_HOME": str(paths.home),
        "GX_ANALYTICS_ENABLED": "false",
    }
    keys = [PREFECT_AUTH] + ([MLFLOW_USER, MLFLOW_PASSWORD] if urls.mlflow_auth else [])
    return env | {k: creds[k] for k in keys if k in creds}


def _ui_origins(urls: StackUrls) -> str:
    """The Prefect UI's own origins (by address and by ``localhost``): the only ones CORS answers."""
    return ",".join([urls.prefect_ui, urls.prefect_ui.replace("127.0.0.1", "localhost", 1)])


def _prefect_server(urls: StackUrls, env: dict[str, str], port: int) -> tuple[list[str], dict[str, str]]:
    """Command and environment of the Prefect server: auth string, CSRF protection, CORS for its UI only."""
    server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"} | {
        "PREFECT_SERVER_API_AUTH_STRING": env[PREFECT_AUTH],
        "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED": "true",
        "PREFECT_SERVER_API_CORS_ALLOWED_ORIGINS": _ui_origins(urls),
        "PREFECT_UI_API_URL": urls.prefect_api,
    }
    return [_bin("prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)], server_env


def _mlflow_server(
    paths: StatePaths, urls: StackUrls, env: dict[str, str], port: int
) -> tuple[list[str], dict[str, str]]:
    """Command and environment of the MLflow server, with its basic-auth app when ``urls.mlflow_auth``."""
    args = [
        _bin("mlflow"), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{paths.home / 'mlflow.db'}",
        "--artifacts-destination", str(paths.mlflow_artifacts),
    ]  # fmt: skip
    if not urls.mlflow_auth:
        return args, env
    ini = paths.stack / "mlflow-auth.ini"
    ini.write_text(
        "[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{mlflow_auth_db(paths)}\nadmin_username = {env[MLFLOW_USER]}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    return [*args, "--app-name", "basic-auth"], env | {
        "MLFLOW_AUTH_CONFIG_PATH": str(ini),
        "MLFLOW_AUTH_ADMIN_PASSWORD": env[MLFLOW_PASSWORD],
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_urlsafe(32),
    }


def _prepare(paths: StatePaths, auth_string: str | None, mlflow_auth: bool) -> None:
    paths.stack.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths.prefect_home.mkdir(parents=True, exist_ok=True)
    paths.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
    ensure_credentials(paths, auth_string, mlflow_auth)


def up(
    paths: StatePaths,
    project_dir: Path,
    *,
    prefect_port: int = 4200,
    mlflow_port: int = 5000,
    deploy: bool = True,
    timeout: float = 180.0,
    auth_string: str | None = None,
    mlflow_auth: bool = False,
) -> StackUrls:
    """Start the servers and the worker, create the pool, register ``prefect.yaml``'s deployments.

    ``auth_string`` is Prefect's API auth string (default: the stored one, else a new random one);
    ``mlflow_auth`` runs MLflow's basic-auth app. A stack that is already running is left as it is."""
    if (urls := running_urls(paths)) is not None:
        return urls
    _prepare(paths, auth_string, mlflow_auth)
    urls = StackUrls(
        f"http://127.0.0.1:{prefect_port}/api",
        f"http://127.0.0.1:{prefect_port}",
        f"http://127.0.0.1:{mlflow_port}",
        mlflow_auth,
    )
    env = {**os.environ, **stack_env(paths, urls), "PWD": str(project_dir)}
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["prefect"] = _start("prefect", *_prefect_server(urls, env, prefect_port), paths, project_dir)
        procs["mlflow"] = _start("mlflow", *_mlflow_server(paths, urls, env, mlflow_port), paths, project_dir)
        _wait_http(f"{urls.prefect_api}/health", timeout, procs["prefect"], paths.stack / "prefect.log")
        _wait_http(f"{urls.mlflow}/health", timeout, procs["mlflow"], paths.stack / "mlflow.log")
        _start_worker(paths, project_dir, env, procs)
        _write_state(paths, procs, urls)
        if deploy:
            _deploy(paths, project_dir, env)
    except BaseException:
        _write_state(paths, procs, urls)
        down(paths)
        raise
    return urls


def _start_worker(
    paths: StatePaths, project_dir: Path, env: dict[str, str], procs: dict[str, subprocess.Popen]
) -> None:
    """Create the ``local`` process pool and start a worker on it."""
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


def _deploy(paths: StatePaths, project_dir: Path, env: dict[str, str]) -> None:
    """Register every deployment of ``prefect.yaml``; its output goes to ``deploy.log``."""
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


def stop_temporary_server(timeout: float = 10.0) -> bool:
    """Stop the temporary Prefect server this process started (a run without ``arl up``), after sending the
    logs and events still queued for it; True when there was one. Prefect stops it at exit otherwise, and
    its "Stopping temporary server" line then follows whatever the command printed last. Nothing happens
    when ``PREFECT_API_URL`` names a server."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    if get_current_settings().api.url or not SubprocessASGIServer().running:
        return False
    APILogWorker.drain_all(timeout=timeout)
    EventsWorker.drain_all(timeout=timeout)
    SubprocessASGIServer().stop()
    return True
