"""The local stack's credentials: generated once, stored 0600 in a file a shell can source, handed out
through :func:`tasks.stack.stack_env`; and a Prefect server started with a user's own auth string (slow: a
real server).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from stack_support import arl, basic, call, free_port

from tasks.settings import StatePaths
from tasks.stack import (
    MLFLOW_PASSWORD,
    MLFLOW_USER,
    PREFECT_AUTH,
    StackUrls,
    credentials_file,
    ensure_credentials,
    mlflow_auth_db,
    read_credentials,
    stack_env,
)

URLS = StackUrls("http://127.0.0.1:1/api", "http://127.0.0.1:1", "http://127.0.0.1:2")


@pytest.fixture
def paths(tmp_path: Path) -> StatePaths:
    p = StatePaths(tmp_path / "arl")
    p.stack.mkdir(parents=True)
    return p


def test_credentials_are_generated_once_and_readable_by_their_owner_only(paths: StatePaths) -> None:
    first = ensure_credentials(paths)
    assert set(first) == {PREFECT_AUTH} and first[PREFECT_AUTH].startswith("arl:")
    assert len(first[PREFECT_AUTH]) > 40
    assert stat.S_IMODE(credentials_file(paths).stat().st_mode) == 0o600
    assert ensure_credentials(paths) == first == read_credentials(paths)
    os.chmod(credentials_file(paths), 0o644)
    ensure_credentials(paths)
    assert stat.S_IMODE(credentials_file(paths).stat().st_mode) == 0o600


def test_a_given_auth_string_replaces_the_stored_one_and_an_empty_one_is_refused(paths: StatePaths) -> None:
    ensure_credentials(paths)
    assert ensure_credentials(paths, "me:s3cret")[PREFECT_AUTH] == "me:s3cret"
    assert read_credentials(paths)[PREFECT_AUTH] == "me:s3cret"
    with pytest.raises(ValueError, match="empty"):
        ensure_credentials(paths, "  ")


def test_a_shell_sourcing_the_file_gets_the_same_values(paths: StatePaths) -> None:
    odd = "me:p@ss w'rd$HOME\"`x`"
    ensure_credentials(paths, odd, mlflow_auth=True)
    script = f'set -a; . "{credentials_file(paths)}"; printf %s "${PREFECT_AUTH}"'
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={}, check=True)
    assert out.stdout == odd


def test_mlflow_credentials_are_kept_and_reach_clients_only_while_its_auth_app_runs(
    paths: StatePaths,
) -> None:
    creds = ensure_credentials(paths, mlflow_auth=True)
    assert creds[MLFLOW_USER] == "arl" and len(creds[MLFLOW_PASSWORD]) > 30
    assert ensure_credentials(paths)[MLFLOW_PASSWORD] == creds[MLFLOW_PASSWORD]  # kept while auth is off
    assert MLFLOW_PASSWORD not in stack_env(paths, URLS)
    env = stack_env(paths, StackUrls(URLS.prefect_api, URLS.prefect_ui, URLS.mlflow, mlflow_auth=True))
    assert env[MLFLOW_USER] == "arl" and env[MLFLOW_PASSWORD] == creds[MLFLOW_PASSWORD]
    assert env[PREFECT_AUTH] == creds[PREFECT_AUTH] and env["PREFECT_API_URL"] == URLS.prefect_api


def test_an_mlflow_user_store_without_its_password_is_refused(paths: StatePaths) -> None:
    mlflow_auth_db(paths).write_bytes(b"")
    with pytest.raises(RuntimeError, match="restore that file"):
        ensure_credentials(paths, mlflow_auth=True)


@pytest.mark.e2e
@pytest.mark.slow
def test_up_with_a_given_auth_string_accepts_it_and_nothing_else(tmp_path: Path) -> None:
    given = f"me:{os.urandom(12).hex()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "ARL_"))}
    env |= {"ARL_HOME": str(tmp_path / "arl"), "ARL_PREFECT_AUTH_STRING": given}
    pp, mp = free_port(), free_port()
    up = arl("up", "--no-deploy", "--prefect-port", str(pp), "--mlflow-port", str(mp), env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert given not in up.stdout + up.stderr
        version = f"http://127.0.0.1:{pp}/api/admin/version"
        assert call(version, Authorization=basic(given))[0] == 200
        assert call(version)[0] == 401 and call(version, Authorization=basic("me:other"))[0] == 401
        # MLflow's auth app is opt-in (--mlflow-auth): without it MLflow answers anyone on this host
        assert call(f"http://127.0.0.1:{mp}/api/2.0/mlflow/experiments/search?max_results=1")[0] == 200
    finally:
        down = arl("down", env=env)
    assert down.returncode == 0 and "stopped: worker, mlflow, prefect" in down.stdout
