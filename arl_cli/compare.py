"""``arl compare``: the pipeline runs of a task side by side, read from MLflow.

Mounted by ``arl_cli.main`` and ``arl_cli.pipeline``; :func:`tracking_uri` is the tracking URI every command
reads MLflow from. Heavy imports happen inside the functions.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer


def compare_cmd(
    task: Annotated[str, typer.Option("--task", "-t", help="Task whose runs to show.")] = "safe-pendulum",
    limit: Annotated[int, typer.Option(help="Most recent pipeline runs to show.")] = 5,
    experiment: Annotated[
        str | None, typer.Option(help="MLflow experiment (default: arl-TASK, the pipeline's).")
    ] = None,
) -> None:
    """The pipeline runs of a task side by side: data, config, stage metrics, evaluation, gate verdict."""
    from rich.console import Console

    table = compare_table(task, limit=limit, experiment=experiment, tracking_uri=tracking_uri())
    if table is None:
        typer.echo(f"no pipeline runs for {task}")
        raise typer.Exit(0)
    Console(width=max(120, 28 * (len(table.columns)))).print(table)


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else the running stack's MLflow (its credentials put in the environment),
    else the local SQLite store."""
    from tasks.settings import state_paths
    from tasks.stack import running_urls, stack_env

    paths = state_paths()
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
    ("offline algo", lambda r: r.data.tags.get("arl.offline_algo", "")),
    ("offline steps", lambda r: r.data.tags.get("arl.offline_steps", "")),
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
