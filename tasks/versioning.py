"""Dataset versions with DVC: add, commit the ``.dvc`` file to git, push to a remote; pull an exact version.

A dataset version is its DVC hash (the ``md5`` of the directory, ``<hex>.dir``); the git commit that holds
its ``.dvc`` file says where it came from. The remote is a local directory by default or S3
(``s3://bucket/prefix``, with ``endpoint_url`` for S3-compatible stores). Credentials come only from the
environment (``AWS_ACCESS_KEY_ID``...), never from code or the DVC config.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from prefect import get_run_logger, task

from arl_models.locks import folder_lock

REMOTE_NAME = "arl"
EVENT_PUSHED = "arl.dataset.pushed"
_HASH = re.compile(r"^[0-9a-f]{32}(\.dir)?$")


@dataclass(frozen=True)
class DataVersion:
    md5: str
    """DVC hash of the dataset directory (``<32 hex>.dir``)."""
    path: str
    """Dataset path relative to the repository root."""
    remote: str
    """URL of the DVC remote the data was pushed to."""
    git_rev: str
    """Commit that records the ``.dvc`` file."""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _git(repo_dir: Path, *args: str) -> str:
    ident: list[str] = []
    if args[0] == "commit" and not _git_config(repo_dir, "user.email"):
        ident = ["-c", "user.name=arl pipeline", "-c", "user.email=arl@localhost"]
    out = subprocess.run(["git", *ident, *args], cwd=repo_dir, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def _git_config(repo_dir: Path, key: str) -> str:
    res = subprocess.run(["git", "config", key], cwd=repo_dir, capture_output=True, text=True)
    return res.stdout.strip()


def configure_remote(repo_dir: str | Path, url: str, *, endpoint_url: str | None = None) -> None:
    """Make ``url`` the default DVC remote (``arl``); only the URL and endpoint go into the config."""
    from dvc.repo import Repo

    with Repo(str(repo_dir)) as repo, repo.config.edit() as conf:
        remote: dict[str, Any] = {"url": url}
        if endpoint_url:
            remote["endpointurl"] = endpoint_url
        conf["remote"][REMOTE_NAME] = remote
        conf["core"]["remote"] = REMOTE_NAME


@contextmanager
def _quiet_init() -> Iterator[None]:
    """Without ``dvc init``'s "You can now commit the changes to git": :func:`ensure_repo` commits them."""
    log = logging.getLogger("dvc.repo.init")
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def ensure_repo(repo_dir: str | Path) -> Path:
    """A git checkout with DVC initialised (``git init`` and ``dvc init`` when missing)."""
    from dvc.repo import Repo

    repo_dir = Path(repo_dir).resolve()
    with folder_lock(repo_dir):
        repo_dir.mkdir(parents=True, exist_ok=True)
        if not (repo_dir / ".git").exists():
            _git(repo_dir, "init", "-q")
        if not (repo_dir / ".dvc").exists():
            with _quiet_init():
                Repo.init(str(repo_dir)).close()
            _git(repo_dir, "add", ".dvc", ".dvcignore")
            _git(repo_dir, "commit", "-q", "-m", "Initialise DVC")
    return repo_dir


def _dvc_file_hash(dvc_file: Path) -> str:
    outs = yaml.safe_load(dvc_file.read_text())["outs"]
    return str(outs[0]["md5"])


def version_dataset(
    path: str | Path, repo_dir: str | Path, *, remote: str | None = None, endpoint_url: str | None = None
) -> DataVersion:
    """``dvc add`` the dataset directory, commit its ``.dvc`` file and ``.gitignore``, ``dvc push``.

    ``remote`` (a directory or ``s3://bucket/prefix``) is configured as the default remote when given;
    without it the repository's configured default is used.
    """

    from tasks.data import dataset_dir

    repo_dir = ensure_repo(repo_dir)
    rel = Path(path).resolve().relative_to(repo_dir)
    dataset_dir(repo_dir, rel.as_posix())
    with folder_lock(repo_dir):
        return _add_commit_push(repo_dir, rel, remote, endpoint_url)


def _add_commit_push(repo_dir: Path, rel: Path, remote: str | None, endpoint_url: str | None) -> DataVersion:
    from dvc.repo import Repo

    if remote is not None:
        configure_remote(repo_dir, remote, endpoint_url=endpoint_url)
    with Repo(str(repo_dir)) as repo:
        # no "To track the changes with git, run: git add ...": the .dvc file is committed just below
        repo.scm_context.quiet = True
        repo.add([str(repo_dir / rel)])
        dvc_file = repo_dir / f"{rel}.dvc"
        md5 = _dvc_file_hash(dvc_file)
        gitignore = (repo_dir / rel).parent / ".gitignore"
        tracked = [str(dvc_file), ".dvc/config", *([str(gitignore)] if gitignore.exists() else [])]
        _git(repo_dir, "add", *tracked)
        if _git(repo_dir, "status", "--porcelain", "--", *tracked):
            _git(repo_dir, "commit", "-q", "-m", f"Dataset {rel} at {md5}")
        repo.push([str(repo_dir / rel)])
        url = repo.config["remote"][repo.config["core"]["remote"]]["url"]
    return DataVersion(md5=md5, path=str(rel), remote=str(url), git_rev=_git(repo_dir, "rev-parse", "HEAD"))


def find_rev(repo_dir: str | Path, path: str, rev_or_hash: str) -> str:
    """The git commit for a version: ``rev_or_hash`` itself, or the latest commit whose ``.dvc`` has that
    hash."""
    repo_dir = Path(repo_dir)
    if not _HASH.match(rev_or_hash):
        return _git(repo_dir, "rev-parse", "--verify", f"{rev_or_hash}^{{commit}}")
    want = rev_or_hash.removesuffix(".dir")
    for rev in _git(repo_dir, "log", "--format=%H", "--", f"{path}.dvc").split():
        text = _git(repo_dir, "show", f"{rev}:{path}.dvc")
        if _dvc_file_hash_text(text).removesuffix(".dir") == want:
            return rev
    raise LookupError(f"no commit in {repo_dir} records {path} with hash {rev_or_hash}")


def _dvc_file_hash_text(text: str) -> str:
    return str(yaml.safe_load(text)["outs"][0]["md5"])


def pull_dataset(repo_dir: str | Path, path: str, rev_or_hash: str, *, out: str | Path | None = None) -> Path:
    """Fetch the exact version (a git rev or a DVC hash) of ``path`` from the remote into ``out``.

    The working tree is left alone. Without ``out`` the copy goes to ``.dvc/tmp/pulled/<hash>/`` (ignored
    by git). Returns the directory holding the dataset.
    """
    from dvc.api import DVCFileSystem

    repo_dir = Path(repo_dir).resolve()
    rev = find_rev(repo_dir, path, rev_or_hash)
    md5 = _dvc_file_hash_text(_git(repo_dir, "show", f"{rev}:{path}.dvc"))
    dest = Path(out) if out is not None else repo_dir / ".dvc" / "tmp" / "pulled" / md5 / Path(path).name
    with folder_lock(dest):
        if dest.exists():
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.partial")
        shutil.rmtree(tmp, ignore_errors=True)  # left by a pull that was killed
        DVCFileSystem(str(repo_dir), rev=rev).get(path, str(tmp), recursive=True)
        tmp.rename(dest)
    return dest


def emit_dataset_pushed(version: DataVersion) -> Any:
    """Emit ``arl.dataset.pushed`` for deployment triggers (a self-hosted server has no webhooks)."""
    from prefect.events import emit_event

    return emit_event(
        event=EVENT_PUSHED,
        resource={
            "prefect.resource.id": f"arl.dataset.{version.md5}",
            "prefect.resource.name": version.path,
            "arl.dataset.path": version.path,
            "arl.dataset.md5": version.md5,
        },
        payload=version.as_dict(),
    )


@task(name="version_dataset", retries=2, retry_delay_seconds=5)
def version_dataset_task(
    path: str, repo_dir: str, remote: str | None = None, endpoint_url: str | None = None
) -> dict[str, str]:
    """Prefect task: version and push the dataset, emit ``arl.dataset.pushed``; returns the version."""
    version = version_dataset(path, repo_dir, remote=remote, endpoint_url=endpoint_url)
    emit_dataset_pushed(version)
    get_run_logger().info("dataset %s versioned as %s at %s", version.path, version.md5, version.git_rev[:8])
    return version.as_dict()
