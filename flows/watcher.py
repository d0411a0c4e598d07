"""``dataset_watcher_flow``: announce dataset versions that reached the data repo without
``arl pipeline push``.

A version committed by hand (``dvc add`` + ``git commit``) or pulled from another clone has a ``.dvc`` hash
the ledger (``.dvc/tmp/arl-announced.json``) has not seen: the watcher emits the same
``arl.dataset.pushed`` event for it, once. The first run on a repo without a ledger records what is there
without announcing it (a baseline, so an old repository does not start a retraining storm).
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task

from tasks.data import announced, current_versions, flow_data_repo, mark_announced
from tasks.settings import state_paths
from tasks.versioning import DataVersion, _git, emit_dataset_pushed


@task(name="announce_new_versions", retries=2, retry_delay_seconds=5)
def announce_new_versions(repo_dir: str, remote: str) -> list[dict[str, str]]:
    logger = get_run_logger()
    versions = current_versions(repo_dir)
    seen = announced(repo_dir)
    if seen is None:
        mark_announced(repo_dir, *[v["md5"] for v in versions])
        logger.info(
            "no ledger in %s yet: recorded %d current version(s) as the baseline", repo_dir, len(versions)
        )
        return []
    new = [v for v in versions if v["md5"] not in seen]
    for v in new:
        emit_dataset_pushed(DataVersion(md5=v["md5"], path=v["path"], remote=remote, git_rev=v["git_rev"]))
        mark_announced(repo_dir, v["md5"])
        logger.info("announced %s at %s (rev %s)", v["path"], v["md5"], v["git_rev"][:8])
    return new


@flow(name="dataset-watcher", log_prints=True)
def dataset_watcher_flow(repo: str | None = None, git_pull: bool = False) -> list[dict[str, str]]:
    """Emit ``arl.dataset.pushed`` for each new ``.dvc`` hash at the data repo's HEAD (``git pull`` first if
    asked)."""
    repo_dir = flow_data_repo(repo, state_paths().data_repo)
    if git_pull:
        _git(repo_dir, "pull", "--ff-only", "-q")
    from tasks.data import _remote_url

    return announce_new_versions(str(repo_dir), _remote_url(repo_dir))
