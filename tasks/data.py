"""Data tasks: make a dataset (generate or import) inside the data repository, resolve and pull an exact
version, and keep the ledger of announced versions that the watcher flow reads.

A dataset lives at ``<data repo>/<name>/`` and is versioned by :mod:`tasks.versioning` (its ``.dvc`` file
committed to the data repo's git). The pipeline never trains on the working tree: it pulls the version
it was asked for (a DVC hash or a git rev) into ``.dvc/tmp/pulled/<hash>/``, so any registered policy can
be retrained from its recorded hash.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from tasks.versioning import _dvc_file_hash_text, _git, ensure_repo, find_rev, pull_dataset

LEDGER = Path(".dvc") / "tmp" / "arl-announced.json"
"""Per data repo: the hashes already announced (or trained on), so the watcher announces each once."""


_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class UnsafeDatasetPath(ValueError):
    """A dataset name or path that is not a plain relative path inside the data repository."""


def check_dataset_path(path: str) -> str:
    """``path`` when it names a dataset inside a data repository, else :class:`UnsafeDatasetPath`.

    A dataset path is one or more names joined by ``/``; a name is letters, digits, ``.``, ``_`` and ``-``,
    starts with a letter or digit and does not end in ``.dvc`` (so ``..``, ``.git``, ``.dvc``, absolute
    paths and empty parts are refused)."""
    parts = path.split("/") if isinstance(path, str) else [repr(path)]
    bad = [p for p in parts if not _PART.fullmatch(p) or p.endswith(".dvc")]
    if bad:
        raise UnsafeDatasetPath(
            f"dataset name {path!r}: {bad[0]!r} is not allowed; a dataset name is letters, digits, '.', '_' "
            "and '-', starting with a letter or digit (parts of a path joined by '/')"
        )
    return path


def dataset_dir(repo_dir: str | Path, name: str) -> Path:
    """Where dataset ``name`` lives in the data repository; refused when it would resolve outside it."""
    root = Path(repo_dir).resolve()
    out = (root / check_dataset_path(name)).resolve()
    if not out.is_relative_to(root) or out == root:
        raise UnsafeDatasetPath(
            f"dataset name {name!r} resolves to {out}, outside the data repository {root}"
        )
    return out


def flow_data_repo(repo: str | None, default: Path) -> Path:
    """The data repository a flow works in: ``default`` (the configured one, created when missing), or
    ``repo``, which must already be a git checkout with DVC initialised: a flow parameter never turns a
    directory into a data repository, so it cannot make a flow write outside one."""
    if repo is None:
        return ensure_repo(default)
    root = Path(repo).resolve()
    if not ((root / ".git").is_dir() and (root / ".dvc").is_dir()):
        raise UnsafeDatasetPath(f"repo {repo!r} is not a data repository (no .git/ and .dvc/ in {root})")
    return root


@task(name="generate_dataset", retries=0, task_run_name="generate {task_name} {quality}")
def generate_dataset_task(
    task_name: str,
    quality: str,
    out: str,
    transitions: int | None,
    seed: int,
    behaviour_steps: int | None,
    cost_penalty: float | None = None,
) -> str:
    """Generate a dataset with the project's behaviour SAC (cached per task, seed, steps and cost penalty)."""
    import sys

    from arl_models.data.generate import generate_dataset
    from arl_models.presets import apply_threads

    apply_threads()  # the behaviour SAC is a learner like the stages
    given = {"transitions": transitions, "cost_penalty": cost_penalty}  # None: the library's default
    info = generate_dataset(
        task_name,
        quality,
        out,
        seed=seed,
        behaviour_steps=behaviour_steps,
        progress=sys.stderr.isatty(),
        **{k: v for k, v in given.items() if v is not None},
    )
    get_run_logger().info("generated %s: %d transitions of %s", out, info.num_transitions, info.quality)
    return out


@task(name="import_dataset", retries=2, retry_delay_seconds=5, task_run_name="import {source}")
def import_dataset_task(source: str, fmt: str, task_name: str, out: str, quality: str, seed: int) -> str:
    """Import a Minari directory, a D4RL-style HDF5 file, or copy a dataset already in the project format."""
    if fmt == "arl":
        from arl_models.data.dataset import read_info, staged_dir

        read_info(source)  # a readable sidecar, or DatasetError
        with staged_dir(Path(out)) as tmp:
            shutil.copytree(source, tmp, dirs_exist_ok=True)
        return out
    from arl_models.data.importers import import_d4rl, import_minari

    fn = {"minari": import_minari, "d4rl": import_d4rl}[fmt]
    fn(source, task_name, out, quality=quality, seed=seed)
    return out


def latest_rev(repo_dir: str | Path, path: str) -> str:
    rev = _git(Path(repo_dir), "log", "-1", "--format=%H", "--", f"{path}.dvc")
    if not rev:
        raise LookupError(f"{repo_dir}: no version of {path!r} has been committed (run `arl pipeline push`)")
    return rev


def behaviour_summary(dataset: str | Path) -> dict[str, str]:
    """The dataset's env version(s) and behaviour policy hash(es), as trace tags.

    One hash is reported as it is; several (a replay collected while the policy changed) as
    ``mixed-<count>-<sha256 of the sorted hashes, 16 hex>``.
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from arl_models.data.dataset import TRANSITIONS_FILE

    table = pq.read_table(Path(dataset) / TRANSITIONS_FILE, columns=["env_version", "policy_hash"])
    envs = sorted(str(v) for v in pc.unique(table["env_version"]).to_pylist())
    hashes = sorted(str(v) for v in pc.unique(table["policy_hash"]).to_pylist())
    if len(hashes) == 1:
        policy = hashes[0]
    else:
        policy = f"mixed-{len(hashes)}-{hashlib.sha256(','.join(hashes).encode()).hexdigest()[:16]}"
    return {"env_version": ",".join(envs) or "unknown", "policy_hash": policy or "unknown"}


def resolve_dataset(repo_dir: str | Path, path: str, version: str | None) -> dict[str, Any]:
    """Pull the exact version (hash or rev; ``None``: the latest committed) and describe it."""
    from arl_models.data.dataset import read_info

    repo_dir = Path(repo_dir).resolve()
    dataset_dir(repo_dir, path)
    rev = find_rev(repo_dir, path, version) if version else latest_rev(repo_dir, path)
    md5 = _dvc_file_hash_text(_git(repo_dir, "show", f"{rev}:{path}.dvc"))
    local = pull_dataset(repo_dir, path, rev)
    info = read_info(local)
    remote = _remote_url(repo_dir)
    return {
        "dir": str(local),
        "md5": md5,
        "path": path,
        "git_rev": rev,
        "repo": str(repo_dir),
        "remote": remote,
        "location": f"{remote.rstrip('/')}#{path}@{rev[:12]}",
        "task": info.task,
        "quality": info.quality,
        "num_transitions": info.num_transitions,
        "cost_budget": info.cost_budget,
        **behaviour_summary(local),
    }


def _remote_url(repo_dir: Path) -> str:
    from dvc.repo import Repo

    with Repo(str(repo_dir)) as repo:
        name = repo.config["core"].get("remote")
        return str(repo.config["remote"][name]["url"]) if name else str(repo_dir)


@task(name="pull_dataset", retries=2, retry_delay_seconds=5, task_run_name="pull {path}@{version}")
def pull_dataset_task(repo_dir: str, path: str, version: str | None) -> dict[str, Any]:
    """Prefect task around :func:`resolve_dataset` (retried: it reads the DVC remote)."""
    desc = resolve_dataset(repo_dir, path, version)
    get_run_logger().info(
        "dataset %s at %s (rev %s): %s", path, desc["md5"], desc["git_rev"][:8], desc["dir"]
    )
    return desc


# ---- the ledger of announced versions (read by the watcher flow) ----


def announced(repo_dir: str | Path) -> set[str] | None:
    """Hashes already announced in this data repo, or ``None`` when the ledger does not exist yet."""
    f = Path(repo_dir) / LEDGER
    return set(json.loads(f.read_text())) if f.is_file() else None


def mark_announced(repo_dir: str | Path, *md5s: str) -> None:
    f = Path(repo_dir) / LEDGER
    f.parent.mkdir(parents=True, exist_ok=True)
    seen = (announced(repo_dir) or set()) | set(md5s)
    tmp = f.with_name(f".{f.name}.tmp")
    tmp.write_text(json.dumps(sorted(seen)))
    tmp.replace(f)


def current_versions(repo_dir: str | Path) -> list[dict[str, str]]:
    """Every dataset tracked at the data repo's HEAD: ``{path, md5, git_rev}`` (``git_rev``: the last commit
    of its ``.dvc`` file)."""
    repo_dir = ensure_repo(repo_dir)
    out = []
    for dvc_file in _git(repo_dir, "ls-files", "*.dvc").split():
        path = dvc_file.removesuffix(".dvc")
        out.append(
            {
                "path": path,
                "md5": _dvc_file_hash_text(_git(repo_dir, "show", f"HEAD:{dvc_file}")),
                "git_rev": latest_rev(repo_dir, path),
            }
        )
    return out


def has_remote(repo_dir: str | Path) -> bool:
    from dvc.repo import Repo

    with Repo(str(repo_dir)) as repo:
        return bool(repo.config["core"].get("remote"))


@task(name="version_dataset", retries=2, retry_delay_seconds=5, task_run_name="version {path}")
def version_and_announce(
    path: str, repo_dir: str, remote: str | None, endpoint_url: str | None, emit_event: bool
) -> dict[str, str]:
    """``dvc add`` + commit + ``dvc push``; emit ``arl.dataset.pushed`` (when asked); note it in the ledger.

    The ledger is written either way: a version versioned here was either announced or is being trained
    on by the caller, so the watcher must not announce it again.
    """
    from tasks.versioning import emit_dataset_pushed, version_dataset

    if remote is None and not has_remote(repo_dir):
        raise ValueError(f"{repo_dir}: no DVC remote configured and none given")
    version = version_dataset(path, repo_dir, remote=remote, endpoint_url=endpoint_url)
    if emit_event:
        emit_dataset_pushed(version)
    mark_announced(repo_dir, version.md5)
    get_run_logger().info(
        "dataset %s versioned as %s (rev %s, remote %s)%s",
        version.path,
        version.md5,
        version.git_rev[:8],
        version.remote,
        "; emitted arl.dataset.pushed" if emit_event else "",
    )
    return version.as_dict()
