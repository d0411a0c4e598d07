"""``arl pipeline``: run the whole pipeline, start and stop the local stack, push and validate datasets,
compare runs.

State lives under ``.arl/`` (or ``$ARL_HOME``); see :mod:`tasks.settings`. Heavy imports happen inside the
commands.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="The orchestrated pipeline: run it, serve it (up/down), push data, compare runs.",
    no_args_is_help=True,
)
PROJECT_DIR = Path(__file__).resolve().parent.parent


def _paths():
    from tasks.settings import state_paths

    return state_paths()


def _environment() -> None:
    """Defaults for Prefect and MLflow before they are imported: the running ``arl up`` stack if there is
    one, else an in-process run (a temporary Prefect server on ``.arl/prefect``, MLflow on SQLite)."""
    from tasks.stack import running_urls, stack_env

    paths = _paths()
    urls = running_urls(paths)
    if urls is not None and not os.environ.get("PREFECT_API_URL"):
        for k, v in stack_env(paths, urls).items():
            os.environ.setdefault(k, v)
        typer.echo(f"using the running stack: Prefect {urls.prefect_ui}, MLflow {urls.mlflow}")
    os.environ.setdefault("PREFECT_HOME", str(paths.prefect_home))
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)  # Prefect makes only the last level
    # the temporary server's first start runs its migrations: slow on 2 busy cores (default 20 s)
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


def _safe_dataset_name(name: str) -> None:
    """Exit 2 naming the problem when ``name`` is not a dataset path inside the data repository."""
    from tasks.data import UnsafeDatasetPath, check_dataset_path

    try:
        check_dataset_path(name)
    except UnsafeDatasetPath as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


@app.command("run")
def run_cmd(
    task: Annotated[
        str,
        typer.Option("--task", "-t", help="Task; its demo dataset is generated when --dataset is not given."),
    ] = "safe-pendulum",
    preset: Annotated[str, typer.Option(help="demo | paper")] = "demo",
    dataset: Annotated[
        str | None,
        typer.Option(
            help="Dataset path inside the data repo (default: <task>-medium-replay, generated if missing)."
        ),
    ] = None,
    version: Annotated[
        str | None, typer.Option(help="DVC hash or git rev of the dataset (default: latest).")
    ] = None,
    seed: int = 0,
    bc_steps: Annotated[int | None, typer.Option(help="BC steps (preset default if unset).")] = None,
    offline_algo: Annotated[
        str | None, typer.Option(help="Stage 2's algorithm: cql | td3bc | iql (default: the preset's).")
    ] = None,
    offline_steps: Annotated[
        int | None, typer.Option(help="Stage 2's gradient steps (preset default if unset).")
    ] = None,
    finetune_steps: Annotated[
        int | None,
        typer.Option(help="Online fine-tuning env steps (preset default if unset; 0 skips the stage)."),
    ] = None,
    continual_steps: Annotated[
        int | None,
        typer.Option(
            help="EWC steps when the champion learned other data versions (preset default; 0 skips)."
        ),
    ] = None,
    eval_episodes: Annotated[int | None, typer.Option(help="Evaluation episodes during training.")] = None,
    threads: Annotated[
        int | None, typer.Option(help="torch threads of each stage's learner (default: the preset's, 1).")
    ] = None,
    gate_episodes: Annotated[
        int,
        typer.Option(
            help="Episodes of the final evaluation (fewer starts decide a mean cost: see GateConfig)."
        ),
    ] = 50,
    cost_budget: Annotated[
        float | None, typer.Option(help="Gate's cost budget (default: the task's).")
    ] = None,
    max_forgetting: Annotated[
        float, typer.Option(help="Gate's bound on the score lost on earlier data versions (stage 4).")
    ] = 10.0,
    refresh: Annotated[
        bool, typer.Option(help="Retrain stages even when a finished result is cached.")
    ] = False,
) -> None:
    """Run the whole pipeline once, in this process: (generate,) version -> validate -> BC -> offline RL -> fine-tuning -> [EWC] -> evaluate -> register -> gate."""
    if dataset is not None:
        _safe_dataset_name(dataset)
    _environment()
    from flows.ingest import ingest_flow
    from flows.offline_to_online import offline_to_online_flow
    from flows.params import DatasetRef, GateConfig, IngestSource, TrainingConfig

    if dataset is None:
        typer.secho(f"[1/2] ingest: the demo dataset of {task}", bold=True)
        v = ingest_flow(IngestSource(task=task, quality="medium-replay"), emit_event=False)
        dataset, version = v["path"], version or v["md5"]
    typer.secho(f"[2/2] pipeline on {dataset}@{version or 'latest'}", bold=True)
    result = offline_to_online_flow(
        DatasetRef(path=dataset, version=version),
        TrainingConfig(
            preset=preset,
            seed=seed,
            bc_steps=bc_steps,
            offline_algo=offline_algo,
            offline_steps=offline_steps,
            finetune_steps=finetune_steps,
            continual_steps=continual_steps,
            eval_episodes=eval_episodes,
            threads=threads,
        ),
        GateConfig(eval_episodes=gate_episodes, cost_budget=cost_budget, max_forgetting=max_forgetting),
        refresh_cache=refresh,
    )
    _print_result(result)


def _data_score(data_dir: str) -> str:
    """The dataset's own mean episode return, normalised where it has references: the bar the stages must beat."""
    from arl_models.data import read_dataset

    t, info = read_dataset(data_dir)
    ret = float(t.episode_returns().mean())
    if info.ref_random_return is None or info.ref_expert_return is None:
        return f"return {ret:.1f} (no reference returns)"
    return f"score {info.normalized_score(ret):.1f} (return {ret:.1f})"


def _print_result(result: dict) -> None:
    d, ev = result["decision"], result["evaluation"]
    typer.echo("")
    typer.echo(f"  {'data':8s} {'':>13s}  {_data_score(result['dataset']['dir'])}")
    for name, s in result["stages"].items():
        m = s["metrics"]
        score = m.get("eval/normalized_score")
        typer.echo(
            f"  {name:8s} {int(s['steps']):>7d} steps  score {score if score is None else round(score, 1)!s:>6}  {s['checkpoint']}"
        )
    typer.echo(
        f"  evaluation: score {ev['score']:.1f}, mean cost {ev['mean_cost']:.1f} (budget {ev['cost_budget']:g})"
    )
    colour = typer.colors.GREEN if d["promoted"] else typer.colors.YELLOW
    typer.secho(f"  {d['model']} version {d['version']} -> {d['alias']}: {d['reason']}", fg=colour)
    typer.echo(f"  MLflow run {result['run_id']} ({result['tracking_uri']})")


@app.command("up")
def up_cmd(
    prefect_port: int = 4200,
    mlflow_port: int = 5000,
    deploy: Annotated[bool, typer.Option(help="Register prefect.yaml's deployments.")] = True,
    auth_string: Annotated[
        str | None,
        typer.Option(
            envvar="ARL_PREFECT_AUTH_STRING",
            show_envvar=True,
            help="Prefect API auth string, 'user:password' (default: the stored one, else a new random one). "
            "Prefer the variable: a command line is visible to other users.",
        ),
    ] = None,
    mlflow_auth: Annotated[
        bool, typer.Option(help="Run MLflow's basic-auth app (user and password generated once, stored).")
    ] = False,
) -> None:
    """Start a Prefect server (API auth string, CSRF protection, CORS for its own UI), an MLflow server and a
    process worker; register the deployments."""
    from tasks.stack import credentials_file, stack_env, up

    paths = _paths()
    typer.echo(f"starting the stack under {paths.home} (logs in {paths.stack}) ...")
    try:
        urls = up(
            paths, PROJECT_DIR, prefect_port=prefect_port, mlflow_port=mlflow_port, deploy=deploy,
            auth_string=auth_string, mlflow_auth=mlflow_auth,
        )  # fmt: skip
    except (RuntimeError, TimeoutError, OSError, ValueError) as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from e
    creds = credentials_file(paths)
    typer.secho(f"Prefect UI: {urls.prefect_ui}", bold=True)
    typer.secho(f"MLflow UI:  {urls.mlflow}", bold=True)
    typer.echo(f"credentials (mode 0600): {creds}")
    typer.echo("  the Prefect UI asks for PREFECT_API_AUTH_STRING from that file" + (
        "; MLflow's for MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD" if urls.mlflow_auth else ""
    ))  # fmt: skip
    typer.echo("to point other shells at it:")
    for k in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        typer.echo(f"  export {k}={stack_env(paths, urls)[k]}")
    typer.echo(f"  set -a; . {creds}; set +a")


@app.command("down")
def down_cmd() -> None:
    """Stop what ``arl pipeline up`` started."""
    from tasks.stack import down

    stopped = down(_paths())
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@app.command("validate")
def validate_cmd(
    path: Path,
    data_docs: Annotated[Path | None, typer.Option(help="Build Great Expectations Data Docs here.")] = None,
) -> None:
    """Validate a dataset directory against the expectation suites; exit 1 naming each failing expectation."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    from arl_models.data import DatasetError
    from tasks.validate import validate_dataset_dir

    try:
        report = validate_dataset_dir(path, data_docs_dir=data_docs)
    except (DatasetError, FileNotFoundError) as e:
        typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from e
    typer.secho(
        report.summary(),
        fg=typer.colors.GREEN if report.success else typer.colors.RED,
        err=not report.success,
    )
    if not report.success:
        raise typer.Exit(1)


@app.command("push")
def push_cmd(
    path: Path,
    name: Annotated[
        str | None, typer.Option(help="Name in the data repo (default: the directory's name).")
    ] = None,
    repo: Annotated[
        Path | None, typer.Option(help="Data repository (default: ARL_DATA_REPO or .arl/data).")
    ] = None,
    remote: Annotated[
        str | None, typer.Option(help="DVC remote to set: a directory or s3://bucket/prefix.")
    ] = None,
    endpoint_url: Annotated[str | None, typer.Option(help="S3 endpoint (MinIO, moto...).")] = None,
    validate: Annotated[bool, typer.Option(help="Validate before versioning.")] = True,
    event: Annotated[
        bool, typer.Option(help="Emit arl.dataset.pushed (starts the retraining deployment).")
    ] = True,
) -> None:
    """Version a dataset with DVC, push it to the remote and announce it (event ``arl.dataset.pushed``)."""
    _environment()
    from tasks.versioning import ensure_repo

    _safe_dataset_name(name or path.resolve().name)
    if validate:
        validate_cmd(path)
    paths = _paths()
    repo_dir = ensure_repo(repo or paths.data_repo)
    version = push_dataset(
        path,
        repo_dir,
        name=name,
        remote=remote,
        endpoint_url=endpoint_url or paths.dvc_endpoint_url,
        emit=event,
    )
    typer.echo(
        f"{version['path']} -> {version['md5']} (rev {version['git_rev'][:8]}, remote {version['remote']})"
    )


def push_dataset(
    path: Path,
    repo_dir: Path,
    *,
    name: str | None = None,
    remote: str | None = None,
    endpoint_url: str | None = None,
    emit: bool = True,
) -> dict[str, str]:
    """Copy ``path`` into the data repo (unless it is there), version, push, announce; returns the version."""
    import shutil

    from arl_models.data.dataset import staged_dir
    from tasks.data import dataset_dir, has_remote, mark_announced
    from tasks.versioning import emit_dataset_pushed, version_dataset

    path = path.resolve()
    if path.is_relative_to(repo_dir) and name is None:
        dest = dataset_dir(repo_dir, str(path.relative_to(repo_dir)))
    else:
        dest = dataset_dir(repo_dir, name or path.name)
        if dest != path:
            with staged_dir(dest) as tmp:
                shutil.copytree(path, tmp, dirs_exist_ok=True)
    if remote is None and not has_remote(repo_dir):
        remote = _paths().dvc_remote
    version = version_dataset(dest, repo_dir, remote=remote, endpoint_url=endpoint_url)
    if emit:
        from prefect.events.worker import EventsWorker

        emit_dataset_pushed(version)
        EventsWorker.drain_all()
    mark_announced(repo_dir, version.md5)
    return version.as_dict()


@app.command("watch")
def watch_cmd(repo: Annotated[Path | None, typer.Option(help="Data repository.")] = None) -> None:
    """Run the dataset watcher once: announce versions that reached the data repo another way."""
    _environment()
    from flows.watcher import dataset_watcher_flow

    new = dataset_watcher_flow(str(repo) if repo else None)
    typer.echo(f"announced {len(new)} new version(s)" + "".join(f"\n  {v['path']} {v['md5']}" for v in new))


@app.command("compare")
def compare_cmd(
    task: Annotated[str, typer.Option("--task", "-t")] = "safe-pendulum",
    limit: Annotated[int, typer.Option(help="Most recent pipeline runs to show.")] = 5,
    experiment: Annotated[str | None, typer.Option(help="MLflow experiment (default arl-<task>).")] = None,
) -> None:
    """The pipeline runs of a task side by side: data, config, stage metrics, evaluation, gate verdict."""
    from rich.console import Console

    table = compare_table(task, limit=limit, experiment=experiment, tracking_uri=_tracking_uri())
    if table is None:
        typer.echo(f"no pipeline runs for {task}")
        raise typer.Exit(0)
    Console(width=max(120, 28 * (len(table.columns)))).print(table)


def _tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else the running stack's MLflow (its credentials put in the environment), else
    the local SQLite store."""
    from tasks.stack import running_urls, stack_env

    paths = _paths()
    urls = running_urls(paths)
    if os.environ.get("MLFLOW_TRACKING_URI") or urls is None:
        return os.environ.get("MLFLOW_TRACKING_URI") or paths.mlflow_uri
    for k, v in stack_env(paths, urls).items():
        if k.startswith("MLFLOW_"):
            os.environ.setdefault(k, v)
    return urls.mlflow


COMPARE_ROWS = (
    ("status", lambda r: r.info.status),
    ("started", lambda r: _when(r.info.start_time)),
    (
        "dataset",
        lambda r: f"{r.data.tags.get('arl.dataset.path', '?')}@{r.data.tags.get('arl.dataset.md5', '')[:8]}",
    ),
    ("preset", lambda r: r.data.params.get("training.preset", "")),
    ("seed", lambda r: r.data.params.get("training.seed", "")),
    ("bc steps", lambda r: r.data.params.get("training.bc_steps", "")),
    ("offline algo", lambda r: r.data.params.get("training.offline_algo", "").replace("None", "(preset's)")),
    ("offline steps", lambda r: r.data.params.get("training.offline_steps", "")),
    *(
        (f"{stage} {what}", lambda r, k=f"{stage}/{key}": _num(r.data.metrics.get(k)))
        for stage in ("bc", "offline", "finetune", "ewc")
        for what, key in (("score", "score"), ("cost", "cost"))
    ),
    ("gated score", lambda r: _num(r.data.metrics.get("score"))),
    ("gated mean cost", lambda r: _num(r.data.metrics.get("mean_cost"))),
    ("gated forgetting", lambda r: _num(r.data.metrics.get("forgetting"))),
    ("model", lambda r: r.data.tags.get("arl.model", "")),
    ("verdict", lambda r: r.data.tags.get("arl.promotion", r.data.tags.get("arl.failed_stage", ""))),
    ("reason", lambda r: r.data.tags.get("arl.promotion.reason", r.data.tags.get("arl.error", ""))),
)
"""Rows of ``arl compare``: stage scores are normalised where the data has reference returns (else empty,
and the gate's score is the mean return)."""


def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def _when(ms: int | None) -> str:
    from datetime import UTC, datetime

    return "" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M")


def compare_table(
    task: str, *, limit: int = 5, experiment: str | None = None, tracking_uri: str | None = None
):
    """A rich table with one column per pipeline run (newest first), or None when there are none."""
    from rich.table import Table

    from tasks.tracking import client

    c = client(tracking_uri)
    exp = c.get_experiment_by_name(experiment or f"arl-{task}")
    if exp is None:
        return None
    runs = c.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.`arl.task` = '{task}'",
        order_by=["attributes.start_time DESC"],
        max_results=limit,
    )
    if not runs:
        return None
    table = Table(title=f"pipeline runs of {task} ({exp.name})", show_lines=False)
    table.add_column("", style="bold")
    for r in runs:
        table.add_column(r.info.run_name or r.info.run_id[:8], overflow="fold")
    table.add_row("run id", *[r.info.run_id[:12] for r in runs])
    for label, get in COMPARE_ROWS:
        table.add_row(label, *[str(get(r)) for r in runs])
    per_version = sorted({k for r in runs for k in r.data.metrics if k.startswith("ewc/forgetting/")})
    for k in per_version:
        table.add_row(
            f"forgetting {k.removeprefix('ewc/forgetting/')}", *[_num(r.data.metrics.get(k)) for r in runs]
        )
    return table
