"""Fixtures for the pipeline tests: temporary homes for Prefect and MLflow, small datasets, S3 on loopback.

Servers are session-scoped (moto's S3 server, one MLflow SQLite store: its migrations cost ~3.5 s).
Credentials are dummy values set through the environment, only here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parents[1] / "flows"))  # stack_support: servers, ports, HTTP

from pipeline_data import make_dataset  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _isolated_homes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """PREFECT_HOME (and its cached results) and MLflow's default store under a temporary directory."""
    home = tmp_path_factory.mktemp("homes")
    saved = {k: os.environ.get(k) for k in ("PREFECT_HOME", "MLFLOW_TRACKING_URI", "GX_ANALYTICS_ENABLED")}
    os.environ["PREFECT_HOME"] = str(home / "prefect")
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{home / 'mlflow-default.db'}"
    os.environ["GX_ANALYTICS_ENABLED"] = "false"
    yield
    if "prefect.server.api.server" in sys.modules:  # a test started Prefect's temporary server
        from tasks.stack import stop_temporary_server

        stop_temporary_server()  # now, while pytest's streams are open, rather than at exit
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def good_dataset(tmp_path: Path) -> Path:
    return make_dataset(tmp_path / "ds")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """moto's S3-protocol server on 127.0.0.1 (a free port); yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dummy credentials for moto, through the environment only."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture(scope="session")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One MLflow SQLite store for the session (artifacts beside it)."""
    root = tmp_path_factory.mktemp("mlflow")
    return f"sqlite:///{root / 'mlflow.db'}"
