"""DVC versioning on a temporary git repository, against a local-directory remote and S3 (moto)."""

from __future__ import annotations

import filecmp
import shutil
import subprocess
from pathlib import Path

import pytest
from pipeline_data import make_dataset

from tasks.versioning import EVENT_PUSHED, emit_dataset_pushed, find_rev, pull_dataset, version_dataset


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"):
        monkeypatch.setenv(var, "arl tests")
    for var in ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"):
        monkeypatch.setenv(var, "tests@localhost")
    root = tmp_path / "repo"
    root.mkdir()
    return root


def _same_files(a: Path, b: Path) -> bool:
    names = ["transitions.parquet", "dataset.json"]
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return match == names


def _two_versions(repo: Path, **remote: str) -> tuple:
    ds = repo / "data" / "ds"
    make_dataset(ds, seed=0)
    saved = repo.parent / "v1"
    shutil.copytree(ds, saved)
    v1 = version_dataset(ds, repo, **remote)
    make_dataset(ds, seed=1)
    v2 = version_dataset(ds, repo)
    return v1, v2, saved


def _forget_local_copies(repo: Path) -> None:
    """Remove the cache and the working copy, so a pull must come from the remote."""
    shutil.rmtree(repo / ".dvc" / "cache")
    shutil.rmtree(repo / "data" / "ds")


def test_local_remote_round_trip(repo: Path, tmp_path: Path) -> None:
    v1, v2, saved = _two_versions(repo, remote=str(tmp_path / "remote"))
    assert v1.md5 != v2.md5 and v1.md5.endswith(".dir") and v1.path == "data/ds"
    assert v1.git_rev != v2.git_rev and v1.remote == str(tmp_path / "remote")
    assert find_rev(repo, "data/ds", v1.md5) == v1.git_rev
    _forget_local_copies(repo)
    by_hash = pull_dataset(repo, "data/ds", v1.md5)
    by_rev = pull_dataset(repo, "data/ds", v1.git_rev, out=tmp_path / "by_rev")
    assert _same_files(by_hash, saved) and _same_files(by_rev, saved)
    assert ".dvc/tmp" in str(by_hash)


def test_versioning_is_idempotent(repo: Path, tmp_path: Path) -> None:
    ds = make_dataset(repo / "data" / "ds")
    a = version_dataset(ds, repo, remote=str(tmp_path / "remote"))
    b = version_dataset(ds, repo)
    assert a == b


def test_versioning_prints_no_git_advice(
    repo: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """DVC's "To track the changes with git, run: git add ..." and "You can now commit the changes to git"
    are wrong here (the pipeline commits them itself): neither is printed nor logged, by init, add or push."""
    ds = make_dataset(repo / "data" / "ds", seed=0)
    with caplog.at_level("INFO"):
        capfd.readouterr()
        version_dataset(ds, repo, remote=str(tmp_path / "remote"))  # git init, dvc init, add, commit, push
        make_dataset(ds, seed=1)
        version = version_dataset(ds, repo)
        out, err = capfd.readouterr()
    said = out + err + "\n".join(r.getMessage() for r in caplog.records)
    for advice in ("To track the changes with git", "git add", "autostage", "commit the changes to git"):
        assert advice not in said, said
    tracked = subprocess.run(
        ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    assert "ds.dvc" not in tracked and ".gitignore" not in tracked  # what DVC advised is committed
    assert find_rev(repo, "data/ds", version.md5) == version.git_rev


def test_unknown_hash_is_an_error(repo: Path, tmp_path: Path) -> None:
    version_dataset(make_dataset(repo / "data" / "ds"), repo, remote=str(tmp_path / "remote"))
    with pytest.raises(LookupError):
        pull_dataset(repo, "data/ds", "0" * 32 + ".dir")


@pytest.mark.e2e
def test_s3_remote_round_trip(repo: Path, s3_server: str, aws_env: None) -> None:
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_server)
    s3.create_bucket(Bucket="arl-data")
    v1, v2, saved = _two_versions(repo, remote="s3://arl-data/dvc", endpoint_url=s3_server)
    assert v1.remote == "s3://arl-data/dvc"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="arl-data", Prefix="dvc/")["Contents"]]
    assert any(v1.md5.removesuffix(".dir")[2:] in k for k in keys)
    config = (repo / ".dvc" / "config").read_text()
    assert "endpointurl" in config and "testing" not in config  # credentials never reach the config
    _forget_local_copies(repo)
    assert _same_files(pull_dataset(repo, "data/ds", v1.md5), saved)


def test_pushed_event(monkeypatch: pytest.MonkeyPatch, repo: Path, tmp_path: Path) -> None:
    from prefect.events.clients import AssertingEventsClient
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    version = version_dataset(make_dataset(repo / "data" / "ds"), repo, remote=str(tmp_path / "remote"))
    # An API URL that is never contacted (the asserting client keeps events in memory): no server starts.
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        worker = EventsWorker.instance(AssertingEventsClient)
        monkeypatch.setattr(EventsWorker, "instance", lambda *_: worker)
        emit_dataset_pushed(version)
        worker.drain()
    events = [e for c in AssertingEventsClient.all for e in c.events if e.event == EVENT_PUSHED]
    assert events[-1].resource.id == f"arl.dataset.{version.md5}"
    assert events[-1].payload["md5"] == version.md5 and events[-1].payload["path"] == "data/ds"
