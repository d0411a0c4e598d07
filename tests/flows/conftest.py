"""Fixtures for the flow tests: a state directory per session (data repo, DVC remote, MLflow SQLite, stage
checkpoints), one Prefect test server, and a tiny valid dataset versioned through ``ingest_flow``.

Environment variables are set when this file is imported, before Prefect reads its settings, so cached
task results land in the session's temporary PREFECT_HOME and not in the user's.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

_HOME = Path(tempfile.mkdtemp(prefix="arl-flows-"))
ENV = {
    "ARL_HOME": str(_HOME / "arl"),
    "ARL_DATA_REPO": str(_HOME / "arl" / "data"),
    "ARL_DVC_REMOTE": str(_HOME / "dvc-remote"),
    "ARL_RUNS_DIR": str(_HOME / "arl" / "runs"),
    "MLFLOW_TRACKING_URI": f"sqlite:///{_HOME / 'mlflow.db'}",
    "ARL_MLFLOW_ARTIFACTS": str(_HOME / "mlartifacts"),
    "PREFECT_HOME": str(_HOME / "prefect"),
    "PREFECT_LOCAL_STORAGE_PATH": str(_HOME / "prefect" / "storage"),
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "GX_ANALYTICS_ENABLED": "false",
    "GIT_AUTHOR_NAME": "arl tests",
    "GIT_COMMITTER_NAME": "arl tests",
    "GIT_AUTHOR_EMAIL": "tests@localhost",
    "GIT_COMMITTER_EMAIL": "tests@localhost",
}
_SAVED = {k: os.environ.get(k) for k in ENV}
os.environ.update(ENV)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Put the environment back and remove the session's state directory (tens of MB after a full run)."""
    shutil.rmtree(_HOME, ignore_errors=True)
    for k, v in _SAVED.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def home() -> Path:
    return _HOME


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """One temporary Prefect server (SQLite) for the session; yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield PREFECT_API_URL.value()


@pytest.fixture(scope="session")
def demo_version(prefect_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny valid safe-pendulum dataset imported, validated and versioned by ``ingest_flow``."""
    from flow_data import ingest_pendulum

    return ingest_pendulum(tmp_path_factory.mktemp("src") / "tiny")
