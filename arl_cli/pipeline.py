"""``arl pipeline``: run the whole pipeline, start and stop the local stack, push and validate datasets,
compare runs.

State lives under ``.arl/`` (or ``$ARL_HOME``); see :mod:`tasks.settings`. Heavy imports happen inside the
commands. ``arl pipeline run`` passes the flow only the settings given on its command line, so the flow's
own defaults (its parameter models, ``tasks.registry.GATE``) hold for the others.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from arl_cli import compare
from arl_cli.common import App
from arl_cli.defaults import library

app = App(help="The orchestrated pipeline: run it, serve it (up/down), push data, compare runs.")
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


TRAINING_OPTIONS = {
    "preset": "preset",
    "seed": "seed",
    "bc_steps": "bc_steps",
    "offline_algo": "offline_algo",
    "offline_steps": "offline_steps",
    "finetune_steps": "finetune_steps",
    "finetune_envs": "finetune_envs",
    "finetune_vector": "finetune_vector",
    "continual_steps": "continual_steps",
    "eval_episodes": "eval_episodes",
    "threads": "threads",
}
"""Option of ``arl pipeline run`` -> the field of the flow's ``TrainingConfig`` it sets."""
GATE_OPTIONS = {
    "gate_episodes": "eval_episodes",
    "gate_seed": "eval_seed",
    "tolerance": "tolerance",
    "cost_budget": "cost_budget",
    "max_forgetting": "max_forgetting",
}
"""Option of ``arl pipeline run`` -> the field of the flow's ``GateConfig`` it sets."""


def given(options: Mapping[str, Any], fields: Mapping[str, str]) -> dict[str, Any]:
    """The flow fields of the options given (not None): the flow's own defaults hold for the others."""
    return {field: options[option] for option, field in fields.items() if options[option] is not None}


_GATE = library("tasks.registry", "GATE")

RunTask = Annotated[
    str | None,
    typer.Option(
        "--task",
        "-t",
        help="Task whose demo dataset is made when --dataset is not given (default: the flow's).",
    ),
]
RunDataset = Annotated[
    str | None,
    typer.Option(
        help="Dataset path inside the data repo (default: the task's demo dataset, made if missing)."
    ),
]
RunVersion = Annotated[str | None, typer.Option(help="DVC hash or git rev of the dataset (default: latest).")]
RunPreset = Annotated[
    str | None,
    typer.Option(help="demo (minutes on 2 cores) | paper (d3rlpy/CORL sizes); default: the flow's."),
]
RunSeed = Annotated[int | None, typer.Option(help="Random seed of every stage (default: the flow's).")]
BcSteps = Annotated[int | None, typer.Option(help="BC gradient steps (default: the preset's).")]
OfflineAlgo = Annotated[
    str | None,
    typer.Option(
        help="Stage 2's algorithm: cql | td3bc | iql | rebrac (default: the preset's for the task)."
    ),
]
OfflineSteps = Annotated[int | None, typer.Option(help="Stage 2's gradient steps (default: the preset's).")]
FinetuneSteps = Annotated[
    int | None,
    typer.Option(help="Fine-tuning environment steps (default: the preset's; 0 skips the stage)."),
]
FinetuneEnvs = Annotated[
    int | None, typer.Option(help="Parallel environments during fine-tuning (default: the library's).")
]
FinetuneVector = Annotated[
    str | None,
    typer.Option(
        help="Fine-tuning's environments: async (worker processes) | sync (in the learner's process); "
        "default: the library's."
    ),
]
ContinualSteps = Annotated[
    int | None,
    typer.Option(
        help="EWC gradient steps, run when the champion learned other data versions (default: the "
        "preset's; 0 skips the stage)."
    ),
]
EvalEpisodes = Annotated[
    int | None, typer.Option(help="Evaluation episodes during training (default: the preset's).")
]
Threads = Annotated[
    int | None, typer.Option(help="torch threads of each stage's learner (default: the preset's).")
]
GateEpisodes = Annotated[
    int | None,
    typer.Option(
        help="Episodes of the gate's evaluation, from fixed starts (default: the gate's, "
        f"{_GATE.eval_episodes})."
    ),
]
GateSeed = Annotated[
    int | None,
    typer.Option(help=f"Seed of the gate's evaluation starts (default: the gate's, {_GATE.eval_seed})."),
]
Tolerance = Annotated[
    float | None,
    typer.Option(
        help="Normalised score points the new policy may trail the champion by (default: the gate's, "
        f"{_GATE.tolerance:g})."
    ),
]
CostBudget = Annotated[
    float | None, typer.Option(help="Mean episode cost the gate allows (default: the task's budget).")
]
MaxForgetting = Annotated[
    float | None,
    typer.Option(
        help="Score the policy may lose on earlier data versions, stage 4 (default: the gate's, "
        f"{_GATE.max_forgetting:g})."
    ),
]
Refresh = Annotated[bool, typer.Option(help="Retrain stages even when a finished result is cached.")]


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    task: RunTask = None,
    dataset: RunDataset = None,
    version: RunVersion = None,
    preset: RunPreset = None,
    seed: RunSeed = None,
    bc_steps: BcSteps = None,
    offline_algo: OfflineAlgo = None,
    offline_steps: OfflineSteps = None,
    finetune_steps: FinetuneSteps = None,
    finetune_envs: FinetuneEnvs = None,
    finetune_vector: FinetuneVector = None,
    continual_steps: ContinualSteps = None,
    eval_episodes: EvalEpisodes = None,
    threads: Threads = None,
    gate_episodes: GateEpisodes = None,
    gate_seed: GateSeed = None,
    tolerance: Tolerance = None,
    cost_budget: CostBudget = None,
    max_forgetting: MaxForgetting = None,
    refresh: Refresh = False,
) -> None:
    """Run the whole pipeline once, in this process, from the data to the promotion gate.

    The stages: (make the demo dataset,) version, validate, BC, offline RL, fine-tuning, EWC, evaluate, gate.
    """
    if dataset is not None:
        _safe_dataset_name(dataset)
    _environment()
    from flows.ingest import ingest_flow
    from flows.offline_to_online import offline_to_online_flow
    from flows.params import DatasetRef, GateConfig, IngestSource, TrainingConfig

    if dataset is None:
        source = IngestSource(**given(ctx.params, {"task": "task"}))
        typer.secho(f"[1/2] ingest: the demo dataset of {source.task}", bold=True)
        v = ingest_flow(source, emit_event=False)
        dataset, version = v["path"], version or v["md5"]
    typer.secho(f"[2/2] pipeline on {dataset}@{version or 'latest'}", bold=True)
    result = offline_to_online_flow(
        DatasetRef(path=dataset, version=version),
        TrainingConfig(**given(ctx.params, TRAINING_OPTIONS)),
        GateConfig(**given(ctx.params, GATE_OPTIONS)),
        refresh_cache=refresh,
    )
    _stop_temporary_server()
    _print_result(result)


def _stop_temporary_server() -> None:
    """Prefect's temporary server (no server configured) stops now, so its goodbye precedes the summary."""
    from tasks.stack import stop_temporary_server

    stop_temporary_server()


def _data_score(data_dir: str) -> str:
    """The dataset's own mean episode return (normalised where it has references) and cost: the bar the
    stages must beat."""
    from arl_models.data import read_dataset

    t, info = read_dataset(data_dir)
    ret, cost = float(t.episode_returns().mean()), float(t.episode_costs().mean())
    if info.ref_random_return is None or info.ref_expert_return is None:
        return f"return {ret:.1f} (no reference returns), cost {cost:.1f}"
    return f"score {info.normalized_score(ret):>6.1f}  cost {cost:6.1f}  (return {ret:.1f})"


def _print_result(result: dict) -> None:
    d, ev = result["decision"], result["evaluation"]
    typer.echo("")
    typer.echo(f"  {'data':8s} {'':>13s}  {_data_score(result['dataset']['dir'])}")
    for name, s in result["stages"].items():
        m = s["metrics"]
        score, cost = m.get("eval/normalized_score"), m.get("eval/cost")
        shown = [v if v is None else round(v, 1) for v in (score, cost)]
        online = f" + {int(s['online_steps'])} online" if s.get("online_steps") else ""
        typer.echo(
            f"  {name:8s} {int(s['steps']):>7d} steps{online}  score {shown[0]!s:>6}  cost {shown[1]!s:>6}  "
            f"{s['checkpoint']}"
        )
    policy = Path(ev["policy"])
    shown_policy = f"{policy.parent.name}/best" if policy.name == "best" else policy.name
    typer.echo(
        f"  evaluation of {shown_policy} ({ev['episodes']} episodes): score {ev['score']:.1f}, "
        f"mean cost {ev['mean_cost']:.1f} (budget {ev['cost_budget']:g})"
    )
    colour = typer.colors.GREEN if d["promoted"] else typer.colors.YELLOW
    typer.secho(f"  {d['model']} version {d['version']} -> {d['alias']}: {d['reason']}", fg=colour)
    typer.echo(f"  MLflow run {result['run_id']} ({result['tracking_uri']})")


_UP = library("tasks.stack", "up")


@app.command("up")
def up_cmd(
    prefect_port: Annotated[int, typer.Option(help="Port of the Prefect server and UI.")] = _UP.prefect_port,
    mlflow_port: Annotated[int, typer.Option(help="Port of the MLflow server and UI.")] = _UP.mlflow_port,
    deploy: Annotated[bool, typer.Option(help="Register prefect.yaml's deployments.")] = _UP.deploy,
    auth_string: Annotated[
        str | None,
        typer.Option(
            envvar="ARL_PREFECT_AUTH_STRING",
            show_envvar=True,
            help="Prefect API auth string, 'user:password' (default: the stored one, else a new random "
            "one). Prefer the variable: a command line is visible to other users.",
        ),
    ] = None,
    mlflow_auth: Annotated[
        bool, typer.Option(help="Run MLflow's basic-auth app (user and password generated once, stored).")
    ] = _UP.mlflow_auth,
) -> None:
    """Start the local stack: a Prefect server, an MLflow server and a process worker.

    The Prefect server checks an API auth string, guards against CSRF and allows CORS for its own UI.
    """
    from tasks.stack import credentials_file, stack_env, up
    from tasks.tracking import UI_WORKFLOW

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
    typer.secho(f"MLflow UI:  {urls.mlflow}/#/experiments?{UI_WORKFLOW}", bold=True)
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
    """Stop what arl up started."""
    from tasks.stack import down

    stopped = down(_paths())
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@app.command("validate")
def validate_cmd(
    path: Annotated[Path, typer.Argument(help="A dataset directory.")],
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
    path: Annotated[Path, typer.Argument(help="A dataset directory.")],
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
    """Version a dataset with DVC, push it to the remote and announce it (event arl.dataset.pushed)."""
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
    _stop_temporary_server()
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
    _stop_temporary_server()
    typer.echo(f"announced {len(new)} new version(s)" + "".join(f"\n  {v['path']} {v['md5']}" for v in new))


app.command("compare")(compare.compare_cmd)
compare_table = compare.compare_table
"""Kept here for the callers that import it from this module."""
