"""``ingest_flow``: generate or import a dataset into the data repository, validate it, version it.

Only data that passed validation is versioned and announced (``arl.dataset.pushed``), so the retraining
trigger never fires on a dataset the pipeline would reject.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger

from arl_models.locks import folder_lock
from flows.params import DEFAULT_SOURCE, IngestSource
from tasks.data import (
    dataset_dir,
    flow_data_repo,
    generate_dataset_task,
    has_remote,
    import_dataset_task,
    version_and_announce,
)
from tasks.settings import state_paths
from tasks.validate import validate_dataset


@flow(name="ingest", log_prints=True)
def ingest_flow(
    source: IngestSource = DEFAULT_SOURCE,
    repo: str | None = None,
    remote: str | None = None,
    emit_event: bool = True,
    overwrite: bool = False,
) -> dict[str, str]:
    """Make the dataset ``source`` describes (unless already present), validate it, version and push it.

    ``repo``: the data repository (default ARL_DATA_REPO or .arl/data); ``remote``: DVC remote to set
    (default ARL_DVC_REMOTE or .arl/dvc-remote when the repo has none). Returns the version
    (``md5``, ``path``, ``remote``, ``git_rev``).
    """
    paths = state_paths()
    repo_dir = flow_data_repo(repo, paths.data_repo)
    out = dataset_dir(repo_dir, source.dataset_name())
    with folder_lock(out):  # another ingest of the same name waits, then versions what this one wrote
        return _make_and_version(source, out, repo_dir, remote, emit_event, overwrite)


def _make_and_version(
    source: IngestSource, out: Path, repo_dir: Path, remote: str | None, emit_event: bool, overwrite: bool
) -> dict[str, str]:
    """Generate or import ``source`` into ``out`` (unless it is there), validate it, version and push it."""
    logger = get_run_logger()
    paths = state_paths()
    if out.exists() and not overwrite:
        logger.info("dataset %s already in %s: versioning it as it is", out.name, repo_dir)
    elif source.kind == "generate":
        generate_dataset_task(
            source.task,
            source.quality,
            str(out),
            source.transitions,
            source.seed,
            source.behaviour_steps,
            source.cost_penalty,
        )
    else:
        if not source.source:
            raise ValueError("import needs `source` (a path)")
        import_dataset_task(
            str(Path(source.source).resolve()),
            source.import_format(),
            source.task,
            str(out),
            source.quality if source.quality != "medium-replay" else "imported",
            source.seed,
        )
    validate_dataset(str(out))
    if remote is None and not has_remote(repo_dir):
        remote = paths.dvc_remote
    return version_and_announce(str(out), str(repo_dir), remote, paths.dvc_endpoint_url, emit_event)
