"""The ``arl`` command: a thin face over the library, the tasks and the flows.

Heavy imports (torch, gymnasium, prefect, mlflow, great_expectations) happen inside the commands, and the
options' defaults are read from the library's source (:mod:`arl_cli.defaults`), so ``arl --help`` answers
at once. The commands live in ``data``, ``train``, ``online``, ``pipeline``, ``doctor``, ``serve`` and
``infra``; this module mounts them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from arl_cli import compare, data, doctor, infra, online, pipeline, serve, train
from arl_cli.common import App, fail
from arl_cli.defaults import library

app = App(
    help="Offline-to-online RL with a safety budget: data, BC, offline RL, fine-tuning, EWC, the pipeline.",
    pretty_exceptions_show_locals=False,
)

_EVALUATE = library("arl_models.offline", "evaluate_checkpoint")


@app.command("tasks")
def tasks_cmd() -> None:
    """List the registered tasks, their versions, budgets and dynamics."""
    from arl_models.envs import get_task, task_names, task_versions

    typer.echo(f"{'task@version':28s} {'environment':16s} {'budget':>6s}  dynamics")
    for name in task_names():
        for v in task_versions(name):
            s = get_task(name, v)
            typer.echo(f"{s.key:28s} {s.env_id:16s} {s.cost_budget:6.1f}  {s.description}")


@app.command("evaluate")
def evaluate_cmd(
    policy: Annotated[Path, typer.Option("--policy", "-p", help="A checkpoint directory.")],
    task: Annotated[
        str | None, typer.Option("--task", "-t", help="Task (default: the policy's own).")
    ] = None,
    episodes: Annotated[int, typer.Option(help="Episodes to run.")] = _EVALUATE.episodes,
    seed: Annotated[
        int, typer.Option(help="Seed of the episodes' starts; the default is the stages' evaluation seed.")
    ] = _EVALUATE.seed,
    as_json: Annotated[bool, typer.Option("--json", help="Print the full result as JSON.")] = False,
) -> None:
    """Run vectorised episodes: return, normalised score, mean episode cost, share over budget."""
    from arl_models.offline import evaluate_checkpoint

    try:
        res = evaluate_checkpoint(policy, task, episodes=episodes, seed=seed)
    except (KeyError, FileNotFoundError) as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(res.to_dict(), indent=2))
        return
    norm = "n/a" if res.normalized_score is None else f"{res.normalized_score:.1f}"
    typer.echo(
        f"{res.task}@{res.env_version}: return {res.mean_return:.1f} ± {res.std_return:.1f}, "
        f"normalised {norm}, cost {res.mean_cost:.1f} (budget {res.cost_budget:g}, "
        f"{100 * res.over_budget_share:.0f}% of episodes over)"
    )


app.add_typer(data.app, name="data")
app.add_typer(train.app, name="train")
app.command("finetune")(online.finetune_cmd)
app.command("continual")(online.continual_cmd)
app.add_typer(pipeline.app, name="pipeline")
app.command("up")(pipeline.up_cmd)
app.command("down")(pipeline.down_cmd)
app.command("compare")(compare.compare_cmd)
app.command("serve")(serve.serve_cmd)
app.command("doctor")(doctor.doctor_cmd)
app.add_typer(infra.app, name="infra")

if __name__ == "__main__":
    app()
