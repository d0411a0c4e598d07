"""``arl finetune`` and ``arl continual``: the online stages (3 and 4) from the command line.

Mounted by ``arl_cli.main`` as top-level commands; the sub-app ``app`` also works on its own. Heavy imports
happen inside the commands. Every option that sets a field of ``FinetuneConfig`` or ``ContinualConfig``
defaults to the library's value, read from its source (:mod:`arl_cli.defaults`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from operator import attrgetter
from pathlib import Path
from typing import Annotated, Any

import typer

from arl_cli.common import App, Seed, Threads, fail
from arl_cli.defaults import library

app = App(help="Constrained online fine-tuning and EWC continual learning.")

_FINETUNE = library("arl_models.online.config", "FinetuneConfig")
_CONTINUAL = library("arl_models.continual", "ContinualConfig")

FINETUNE_FIELDS = {
    "seed": "seed",
    "steps": "steps",
    "num_envs": "num_envs",
    "offline_ratio": "offline_ratio",
    "conservative": "conservative",
    "budget": "cost_budget",
    "constrained": "constrained",
    "cost_margin": "cost_margin",
    "cost_signal": "cost_signal",
    "kp": "pid.kp",
    "ki": "pid.ki",
    "kd": "pid.kd",
    "utd": "utd",
    "eval_every": "eval_every",
    "eval_episodes": "eval_episodes",
    "keep_best": "keep_best",
    "preprocess": "preprocess",
    "preprocess_scale": "preprocess_scale",
    "vector": "vector",
    "pipeline": "pipeline",
    "workers": "workers.num_workers",
    "backend": "workers.backend",
    "ray_address": "workers.address",
    "sync_every": "workers.sync_every",
    "tune": "workers.tune",
}
"""Option of ``arl finetune`` -> the ``FinetuneConfig`` field it sets (``pid.kp``: ``kp`` of ``pid``)."""


_FT = {option: attrgetter(path)(_FINETUNE) for option, path in FINETUNE_FIELDS.items()}
"""The library's default of each of those options."""


def finetune_config(options: Mapping[str, Any]) -> Any:
    """The library's ``FinetuneConfig`` with the value of each option of :data:`FINETUNE_FIELDS` in its
    field."""
    from arl_models.online.config import FinetuneConfig

    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    for option, path in FINETUNE_FIELDS.items():
        parent, _, name = path.rpartition(".")
        (nested.setdefault(parent, {}) if parent else top)[name] = options[option]
    cfg = FinetuneConfig()
    return replace(cfg, **top, **{k: replace(getattr(cfg, k), **v) for k, v in nested.items()})


def continual_config(
    *,
    seed: int,
    steps: int,
    ewc_weight: float,
    decay: float,
    ewc_networks: str,
    rehearsal: float,
    online_steps: int,
    baseline: bool,
    eval_episodes: int,
    eval_every: int,
) -> Any:
    """The library's ``ContinualConfig`` with the options' values in its fields (its EWC's seed the run's)."""
    from arl_models.continual import ContinualConfig

    cfg = ContinualConfig()
    networks = tuple(n.strip() for n in ewc_networks.split(",") if n.strip()) or cfg.ewc.networks
    ewc = replace(cfg.ewc, seed=seed, weight=ewc_weight, decay=decay, networks=networks)
    return replace(
        cfg,
        seed=seed,
        steps=steps,
        ewc=ewc,
        rehearsal=rehearsal,
        online_steps=online_steps,
        baseline=baseline,
        eval_episodes=eval_episodes,
        eval_every=eval_every,
    )


From = Annotated[
    Path, typer.Option("--from", help="Checkpoint directory to start from (CQL, or an earlier stage).")
]
Out = Annotated[
    Path,
    typer.Option(
        "--out",
        "-o",
        help="Checkpoint directory to write; one holding a run of the same settings and data is resumed, "
        "one of others refused.",
    ),
]
FtTask = Annotated[
    str | None,
    typer.Option("--task", "-t", help="Task, e.g. safe-hopper@1.1.0 (default: the checkpoint's)."),
]
FtData = Annotated[
    Path | None, typer.Option("--data", "-d", help="Offline dataset to mix in (default: the checkpoint's).")
]
Steps = Annotated[int, typer.Option(help="Environment steps of fine-tuning, all environments together.")]
NumEnvs = Annotated[int, typer.Option(help="Parallel environments (worker processes with --vector async).")]
OfflineRatio = Annotated[
    float,
    typer.Option(
        help="Share of each batch drawn from the offline data (symmetric sampling, Ball et al. 2023)."
    ),
]
Conservative = Annotated[
    str, typer.Option(help="Critic regime: none (SAC) | cql | calql (Cal-QL, Nakamoto et al. 2023).")
]
Budget = Annotated[float | None, typer.Option(help="Episode cost budget (default: the task's).")]
Constrained = Annotated[
    bool, typer.Option(help="Hold the episode cost to the budget with the PID Lagrange multiplier.")
]
CostMargin = Annotated[
    float,
    typer.Option(
        help="Share of the budget held in reserve: the measured cost is held to budget x (1 - margin)."
    ),
]
CostSignal = Annotated[
    str,
    typer.Option(
        help="Cost the multiplier measures: evaluation (each round's deterministic evaluation, the policy "
        "handed over; the training episodes' in rounds without one) | episodes (the training episodes')."
    ),
]
Kp = Annotated[
    float,
    typer.Option(
        help="Proportional gain of the PID Lagrange multiplier (Stooke et al. 2020) on the relative "
        "violation: measured cost / budget - (1 - margin)."
    ),
]
Ki = Annotated[
    float, typer.Option(help="Integral gain of the multiplier (gradient ascent's step when kp = kd = 0).")
]
Kd = Annotated[float, typer.Option(help="Derivative gain of the multiplier.")]
Utd = Annotated[float, typer.Option(help="Gradient updates per environment step.")]
EvalEvery = Annotated[
    int, typer.Option(help="Rounds between deterministic evaluations (0: only at the start and the end).")
]
EvalEpisodes = Annotated[
    int,
    typer.Option(
        help="Deterministic episodes per evaluation, from fixed starts (0: no evaluations, so no OUT/best)."
    ),
]
KeepBest = Annotated[
    bool,
    typer.Option(
        help="Keep OUT/best: the policy whose evaluation had the highest return within the budget, the "
        "start's included (what to deploy; OUT itself continues)."
    ),
]
Preprocess = Annotated[
    str,
    typer.Option(
        help="Transform of the training observations on the learner, never on the acting path: "
        "none | amplitude | noise."
    ),
]
PreprocessScale = Annotated[
    float,
    typer.Option(help="amplitude: z ~ U[1-s, 1+s] per row; noise: std s x the data's std per dimension."),
]
Vector = Annotated[
    str, typer.Option(help="Sync pipeline's environments: async (worker processes) | sync (in this process).")
]
Pipeline = Annotated[
    str,
    typer.Option(help="sync: collect and update in turn | async: workers collect while the learner updates."),
]
Workers = Annotated[int, typer.Option(help="Async pipeline: environment workers.")]
Backend = Annotated[str, typer.Option(help="Async pipeline: process | ray (Ray actors; the ray extra).")]
RayAddress = Annotated[
    str | None,
    typer.Option(help="Ray cluster to attach to, e.g. ray://head:10001 (default: a local Ray)."),
]
SyncEvery = Annotated[int, typer.Option(help="Async pipeline: learner updates between weight broadcasts.")]
Tune = Annotated[
    bool, typer.Option(help="Async pipeline: let the rate tuner move the number of workers and the UTD.")
]
Restart = Annotated[bool, typer.Option("--restart", help="Discard the checkpoint in --out and start over.")]


@app.command("finetune")
def finetune_cmd(
    ctx: typer.Context,
    from_dir: From,
    out: Out,
    task: FtTask = None,
    steps: Steps = _FT["steps"],
    data: FtData = None,
    num_envs: NumEnvs = _FT["num_envs"],
    offline_ratio: OfflineRatio = _FT["offline_ratio"],
    conservative: Conservative = _FT["conservative"],
    budget: Budget = _FT["budget"],
    constrained: Constrained = _FT["constrained"],
    cost_margin: CostMargin = _FT["cost_margin"],
    cost_signal: CostSignal = _FT["cost_signal"],
    kp: Kp = _FT["kp"],
    ki: Ki = _FT["ki"],
    kd: Kd = _FT["kd"],
    utd: Utd = _FT["utd"],
    eval_every: EvalEvery = _FT["eval_every"],
    eval_episodes: EvalEpisodes = _FT["eval_episodes"],
    keep_best: KeepBest = _FT["keep_best"],
    preprocess: Preprocess = _FT["preprocess"],
    preprocess_scale: PreprocessScale = _FT["preprocess_scale"],
    vector: Vector = _FT["vector"],
    pipeline: Pipeline = _FT["pipeline"],
    workers: Workers = _FT["workers"],
    backend: Backend = _FT["backend"],
    ray_address: RayAddress = _FT["ray_address"],
    sync_every: SyncEvery = _FT["sync_every"],
    tune: Tune = _FT["tune"],
    seed: Seed = _FT["seed"],
    threads: Threads = None,
    restart: Restart = False,
) -> None:
    """Constrained online fine-tuning (stage 3): SAC under a PID Lagrange multiplier on episode cost.

    Warm-started from the checkpoint of stage 2, with every batch mixing offline and online data.
    """
    from arl_models.presets import apply_threads

    apply_threads(threads=threads)
    from arl_models.data import DatasetError
    from arl_models.online import finetune
    from arl_models.train import TrainingDiverged

    cfg = finetune_config(ctx.params)
    try:
        final = finetune(from_dir, out, task=task, data=data, config=cfg, restart=restart)
    except (DatasetError, KeyError, ValueError, FileNotFoundError, ImportError, TrainingDiverged) as e:
        fail(str(e))
    typer.echo(json.dumps({k: round(v, 4) for k, v in final.items()}, indent=2))


_EWC_NETWORKS = ",".join(_CONTINUAL.ewc.networks)
NewData = Annotated[Path, typer.Option("--data", "-d", help="The new version's dataset.")]
Previous = Annotated[
    list[Path] | None,
    typer.Option(
        "--previous", metavar="<path>", help="Earlier versions' datasets, oldest first (repeatable)."
    ),
]
NaiveFrom = Annotated[
    Path | None, typer.Option(help="Where the naive baseline's chain continues from (default: --from).")
]
ContinualSteps = Annotated[int, typer.Option(help="Offline gradient steps on the new data.")]
EwcWeight = Annotated[
    float,
    typer.Option(help="Weight of the EWC penalty (Kirkpatrick et al. 2017); 0: naive sequential training."),
]
EwcDecay = Annotated[
    float,
    typer.Option(
        help="Online EWC (Schwarz et al. 2018): the Fisher accumulated over the earlier versions is "
        "multiplied by this per new version."
    ),
]
EwcNetworks = Annotated[
    str,
    typer.Option(
        help="Networks the penalty holds, comma-separated, of actor, critic, cost_critic (the policy alone: "
        "actor)."
    ),
]
Rehearsal = Annotated[
    float,
    typer.Option(
        help="Share of each offline batch drawn from the earlier versions' datasets (0: the new data alone; "
        "the baseline never rehearses)."
    ),
]
OnlineSteps = Annotated[
    int, typer.Option(help="Fine-tuning steps on the new environment version afterwards (0: offline only).")
]
Baseline = Annotated[
    bool, typer.Option(help="Also train the naive baseline (no penalty, no rehearsal) and report it.")
]
ContinualEvalEpisodes = Annotated[int, typer.Option(help="Evaluation episodes on each version.")]
ContinualEvalEvery = Annotated[
    int,
    typer.Option(
        help="Evaluate on every version each this many offline steps, a multiple of "
        f"{_CONTINUAL.log_every} (curves in metrics.jsonl; 0: the final evaluation only)."
    ),
]


@app.command("continual")
def continual_cmd(
    from_dir: From,
    data: NewData,
    out: Out,
    previous: Previous = None,
    naive_from: NaiveFrom = None,
    steps: ContinualSteps = _CONTINUAL.steps,
    ewc_weight: EwcWeight = _CONTINUAL.ewc.weight,
    decay: EwcDecay = _CONTINUAL.ewc.decay,
    ewc_networks: EwcNetworks = _EWC_NETWORKS,
    rehearsal: Rehearsal = _CONTINUAL.rehearsal,
    online_steps: OnlineSteps = _CONTINUAL.online_steps,
    baseline: Baseline = _CONTINUAL.baseline,
    eval_episodes: ContinualEvalEpisodes = _CONTINUAL.eval_episodes,
    eval_every: ContinualEvalEvery = _CONTINUAL.eval_every,
    seed: Seed = _CONTINUAL.seed,
    threads: Threads = None,
) -> None:
    """EWC continual learning (stage 4): train on a new version, report per-version scores and forgetting."""
    from arl_models.presets import apply_threads

    apply_threads(threads=threads)
    from arl_models.continual import train_continual
    from arl_models.data import DatasetError
    from arl_models.train import TrainingDiverged

    try:
        cfg = continual_config(
            seed=seed,
            steps=steps,
            ewc_weight=ewc_weight,
            decay=decay,
            ewc_networks=ewc_networks,
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
        fail(str(e))
    for name in ("ewc", "naive"):
        if name in report:
            r = report[name]
            typer.echo(
                f"{name:5s} new {r['new_version']} score {r['new_score']:.1f}; forgetting "
                + ", ".join(f"{k} {v:.1f}" for k, v in r["forgetting"].items())
                + f" (mean {r['mean_forgetting']:.1f})"
            )
