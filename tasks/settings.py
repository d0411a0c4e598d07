"""Where the pipeline keeps its state on one machine, and how each place is overridden.

Everything lives under one state directory, ``ARL_HOME`` (default ``.arl/`` in the working directory, which
is the repository root for ``make run``)::

    .arl/
      data/           the data repository: a git + DVC checkout holding the datasets (ARL_DATA_REPO)
      dvc-remote/     the default DVC remote, a plain directory (ARL_DVC_REMOTE: a path or s3://...)
      mlflow.db       MLflow's SQLite store (MLFLOW_TRACKING_URI)
      mlartifacts/    MLflow's artifacts (ARL_MLFLOW_ARTIFACTS)
      prefect/        PREFECT_HOME for ``arl up`` and in-process runs: Prefect's SQLite and cached results
      runs/           stage checkpoints, content-addressed: runs/<dataset>/<stage>-<key>/
      stack/          pid files and logs of what ``arl up`` started

``ARL_DVC_ENDPOINT_URL`` points DVC's S3 remote at an S3-compatible store (MinIO, moto). Nothing here
imports Prefect or MLflow.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


def _env_path(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value).expanduser().resolve() if value else default


@dataclass(frozen=True)
class StatePaths:
    home: Path

    @property
    def data_repo(self) -> Path:
        return _env_path("ARL_DATA_REPO", self.home / "data")

    @property
    def dvc_remote(self) -> str:
        return os.environ.get("ARL_DVC_REMOTE") or str(self.home / "dvc-remote")

    @property
    def dvc_endpoint_url(self) -> str | None:
        return os.environ.get("ARL_DVC_ENDPOINT_URL") or None

    @property
    def mlflow_uri(self) -> str:
        return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{self.home / 'mlflow.db'}"

    @property
    def mlflow_artifacts(self) -> Path:
        return _env_path("ARL_MLFLOW_ARTIFACTS", self.home / "mlartifacts")

    @property
    def prefect_home(self) -> Path:
        return self.home / "prefect"

    @property
    def runs(self) -> Path:
        return _env_path("ARL_RUNS_DIR", self.home / "runs")

    @property
    def stack(self) -> Path:
        return self.home / "stack"


def state_paths(home: str | Path | None = None) -> StatePaths:
    """The state directory: ``home``, else ``$ARL_HOME``, else ``./.arl``."""
    if home is not None:
        return StatePaths(Path(home).expanduser().resolve())
    return StatePaths(_env_path("ARL_HOME", Path.cwd().resolve() / ".arl"))


def artifact_location(uri: str, paths: StatePaths) -> str | None:
    """Where a new experiment keeps artifacts: a local directory for a SQLite store, the server's default
    otherwise."""
    return paths.mlflow_artifacts.as_uri() if uri.startswith("sqlite:") else None


def git_commit(cwd: str | Path | None = None) -> str:
    """The code's git commit (``unknown`` outside a checkout), for trace tags."""
    if os.environ.get("ARL_GIT_COMMIT"):
        return os.environ["ARL_GIT_COMMIT"]
    here = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True)
    return res.stdout.strip() if res.returncode == 0 and res.stdout.strip() else "unknown"
