"""``arl finetune`` and ``arl continual``: the online stages (3 and 4) from the command line.

Mounted by ``arl_cli.main`` as top-level commands (``app.command("finetune")(finetune_cmd)``); the
sub-app ``app`` also works on its own. Heavy imports happen inside the commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Constrained online fine-tuning and EWC continual learning.", no_args_is_help=True)

From = Annotated[
    Path, typer.Option("--from", help="Checkpoint directory to start from (CQL, or an earlier stage).")
]
Out = Annotated[
    Path,
    typer.Option(
        "--out",
        "-o",
        help="Checkpoint directory to write; one holding a run of the same settings and data is resumed, one of others refused.",
    ),
]
Seed = Annotated[int, typer.Option(help="Random seed (uint32).")]


def _fail(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)  # small networks: more threads only contend with the env workers


def finetune_cmd(
    from_dir: From,
    out: Out,
    task: Annotated[
        str | None,
        typer.Option("--task", "-t", help="Task, e.g. safe-hopper@1.1.0 (default: the checkpoint's)."),
    ] = None,
    steps: Annotated[int, typer.Option(help="Environment steps of fine-tuning.")] = 20_000,
    data: Annotated[
        Path | None,
        typer.Option("--data", "-d", help="Offline dataset to mix in (default: the checkpoint's)."),
    ] = None,
    num_envs: Annotated[int, typer.Option(help="Parallel environment workers.")] = 4,
    offline_ratio: Annotated[float, typer.Option(help="Share of each batch from the offline data.")] = 0.5,
    conservative: Annotated[str, typer.Option(help="none (SAC) | cql | calql")] = "none",
    budget: Annotated[float | None, typer.Option(help="Episode cost budget (default: the task's).")] = None,
    constrained: Annotated[
        bool, typer.Option(help="Hold episode cost to the budget with the PID multiplier.")
    ] = True,
    cost_margin: Annotated[
        float,
        typer.Option(
            help="Share of the budget held in reserve: training episodes are held to budget x (1 - margin)."
        ),
    ] = 0.6,
    kp: Annotated[
        float,
        typer.Option(help="Multiplier's proportional gain, on the relative violation cost / budget - 1."),
    ] = 1.0,
    ki: Annotated[
        float, typer.Option(help="Multiplier's integral gain (gradient ascent's step with kp=kd=0).")
    ] = 0.5,
    kd: Annotated[float, typer.Option(help="Multiplier's derivative gain.")] = 0.0,
    utd: Annotated[float, typer.Option(help="Gradient updates per environment step.")] = 1.0,
    eval_every: Annotated[int, typer.Option(help="Rounds between evaluations.")] = 5,
    eval_episodes: Annotated[
        int,
        typer.Option(
            help="Deterministic episodes per evaluation, from fixed starts (0: no evaluations, "
            "so no OUT/best)."
        ),
    ] = 10,
    keep_best: Annotated[
        bool,
        typer.Option(
            help="Keep OUT/best: the policy whose evaluation had the highest return within "
            "the budget, the start's included (what to deploy; OUT itself continues)."
        ),
    ] = True,
    preprocess: Annotated[
        str,
        typer.Option(
            help="Batched transform of training observations on the learner (never on the workers): none | amplitude | noise"
        ),
    ] = "none",
    preprocess_scale: Annotated[
        float,
        typer.Option(help="amplitude: z ~ U[1-s, 1+s] per row; noise: std s x the data's std per dimension."),
    ] = 0.1,
    vector: Annotated[
        str, typer.Option(help="Sync pipeline's vector env: async (worker processes) | sync")
    ] = "async",
    pipeline: Annotated[
        str,
        typer.Option(
            help="sync: collect and update in turn | async: workers collect while the learner updates"
        ),
    ] = "sync",
    workers: Annotated[int, typer.Option(help="Async pipeline: environment workers.")] = 2,
    backend: Annotated[
        str, typer.Option(help="Async pipeline: process | ray (Ray actors, the `ray` extra)")
    ] = "process",
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster to attach to, e.g. ray://head:10001 (default: local Ray).")
    ] = None,
    sync_every: Annotated[
        int, typer.Option(help="Async pipeline: learner updates between weight broadcasts.")
    ] = 50,
    tune: Annotated[
        bool, typer.Option(help="Async pipeline: let the rate tuner move workers and UTD.")
    ] = False,
    seed: Seed = 0,
    restart: Annotated[
        bool, typer.Option("--restart", help="Discard the checkpoint in --out and start over.")
    ] = False,
) -> None:
    """Constrained online fine-tuning (stage 3): SAC with a PID Lagrange multiplier on episode cost,
    warm-started from the CQL checkpoint, offline and online data mixed."""
    _one_thread()
    from arl_models.data import DatasetError
    from arl_models.lagrange import PIDConfig
    from arl_models.online import FinetuneConfig, WorkerConfig, finetune
    from arl_models.train import TrainingDiverged

    pool = WorkerConfig(
        backend=backend, address=ray_address, num_workers=workers, sync_every=sync_every, tune=tune
    )
    cfg = FinetuneConfig(
        seed=seed,
        steps=steps,
        num_envs=num_envs,
        offline_ratio=offline_ratio,
        conservative=conservative,
        cost_budget=budget,
        cost_margin=cost_margin,
        constrained=constrained,
        pid=PIDConfig(kp=kp, ki=ki, kd=kd),
        utd=utd,
        eval_every=eval_every,
        eval_episodes=eval_episodes,
        keep_best=keep_best,
        vector=vector,
        pipeline=pipeline,
        workers=pool,
        preprocess=preprocess,
        preprocess_scale=preprocess_scale,
    )
    try:
        final = finetune(from_dir, out, task=task, data=data, config=cfg, restart=restart)
    except (DatasetError, KeyError, ValueError, FileNotFoundError, ImportError, TrainingDiverged) as e:
        _fail(str(e))
    typer.echo(json.dumps({k: round(v, 4) for k, v in final.items()}, indent=2))


def continual_cmd(
    from_dir: From,
    data: Annotated[Path, typer.Option("--data", "-d", help="The new version's dataset.")],
    out: Out,
    previous: Annotated[
        list[Path] | None,
        typer.Option("--previous", help="Earlier versions' datasets, oldest first (repeatable)."),
    ] = None,
    naive_from: Annotated[
        Path | None, typer.Option(help="Where the naive baseline's chain continues from (default: --from).")
    ] = None,
    steps: Annotated[int, typer.Option(help="Offline gradient steps on the new data.")] = 5_000,
    ewc_weight: Annotated[
        float | None,
        typer.Option(
            help="EWC penalty weight (default: EWCConfig's, 100). On the plant-conditioned 2.x versions 3 learned new "
            "versions faster at the same forgetting (benchmarks/README.md)."
        ),
    ] = None,
    decay: Annotated[
        float | None,
        typer.Option(help="Online EWC decay of the accumulated Fisher (default: EWCConfig's, 0.9)."),
    ] = None,
    ewc_networks: Annotated[
        str | None,
        typer.Option(
            help="Networks the penalty holds, comma-separated, of actor, critic, "
            "cost_critic (default: all; the policy alone: actor)."
        ),
    ] = None,
    rehearsal: Annotated[
        float,
        typer.Option(
            help="Share of each offline batch drawn from the earlier versions' datasets "
            "(0: the new data alone; the baseline never rehearses)."
        ),
    ] = 0.0,
    online_steps: Annotated[
        int, typer.Option(help="Online fine-tuning steps on the new env version (0: offline only).")
    ] = 0,
    baseline: Annotated[bool, typer.Option(help="Also train the naive (no penalty) baseline.")] = True,
    eval_episodes: int = 10,
    eval_every: Annotated[
        int,
        typer.Option(
            help="Evaluate on every version each this many offline steps, a multiple "
            "of 500 (curves in metrics.jsonl; 0: the final evaluation only)."
        ),
    ] = 0,
    seed: Seed = 0,
) -> None:
    """EWC continual learning (stage 4): train on a new version, report per-version scores and forgetting."""
    _one_thread()
    from arl_models.algos.ewc import NETWORKS, EWCConfig
    from arl_models.continual import ContinualConfig, train_continual
    from arl_models.data import DatasetError
    from arl_models.presets import with_given
    from arl_models.train import TrainingDiverged

    try:
        networks = (
            tuple(n.strip() for n in ewc_networks.split(",") if n.strip()) if ewc_networks else NETWORKS
        )
        cfg = ContinualConfig(
            seed=seed,
            steps=steps,
            ewc=with_given(EWCConfig(seed=seed, networks=networks), weight=ewc_weight, decay=decay),
            rehearsal=rehearsal,
            online_steps=online_steps,
            baseline=baseline,
            eval_episodes=eval_episodes,
            eval_every=eval_every,
        )
        report = train_continual(
            from_dir, data, out, previous=previous or None, naive_from=naive_from, config=cfg
        )
    except (DatasetError, KeyError, ValueError, FileNotFoundError, TrainingDiverged) as e:
        _fail(str(e))
    for name in ("ewc", "naive"):
        if name in report:
            r = report[name]
            typer.echo(
                f"{name:5s} new {r['new_version']} score {r['new_score']:.1f}; forgetting "
                + ", ".join(f"{k} {v:.1f}" for k, v in r["forgetting"].items())
                + f" (mean {r['mean_forgetting']:.1f})"
            )


app.command("finetune")(finetune_cmd)
app.command("continual")(continual_cmd)
