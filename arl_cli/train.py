"""``arl train``: one offline stage (BC, CQL, TD3+BC, IQL, ReBRAC) or the pipeline's offline half.

Mounted by ``arl_cli.main``. Heavy imports happen inside the commands; the options' defaults are the
library's (:mod:`arl_cli.defaults`): the stage functions' keywords, and ``None`` for what the preset sets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from arl_cli.common import App, Seed, Threads, fail
from arl_cli.defaults import library

app = App(help="Train one stage on a dataset and write a checkpoint directory.")

_BC = library("arl_models.offline", "train_bc")
_STAGE2 = library("arl_models.offline", "train_offline_algo")
_OFFLINE = library("arl_models.offline", "train_offline")

Data = Annotated[
    Path,
    typer.Option(
        "--data",
        "-d",
        help="Dataset directory; refused unless it passes the expectation suites (arl data validate).",
    ),
]
Out = Annotated[
    Path,
    typer.Option(
        "--out",
        "-o",
        help="Checkpoint directory; one holding a run of the same settings and data is resumed, one of "
        "others refused.",
    ),
]
Restart = Annotated[
    bool, typer.Option("--restart", help="Discard the checkpoint in --out and train from scratch.")
]
Preset = Annotated[str, typer.Option(help="demo (small, minutes on 2 cores) | paper (d3rlpy/CORL sizes).")]
Steps = Annotated[int | None, typer.Option(help="Gradient steps (default: the preset's).")]
ContextDim = Annotated[
    int | None,
    typer.Option(
        help="Trailing observation entries that describe the plant and condition the networks (FiLM, Perez "
        "et al. 2018); default: what the dataset's task observes (3 on the 2.x versions, else 0); 0: none."
    ),
]
ContextLrScale = Annotated[
    float | None,
    typer.Option(
        help="Learning rate of the FiLM weights as a multiple of their network's (default: the preset's)."
    ),
]
InitActor = Annotated[Path | None, typer.Option(help="A BC checkpoint to start the actor from.")]
Constrained = Annotated[
    bool, typer.Option(help="Hold the actor to the dataset's cost budget (a Lagrange multiplier).")
]


def _preset_config(stage: str, preset: str, **fields: Any) -> Any:
    """The preset's config of ``stage`` (``bc`` or an offline algorithm) with the fields the command line
    set (not None)."""
    from arl_models.presets import get_preset, with_given

    return with_given(getattr(get_preset(preset), stage), **fields)


def _require_valid(data: Path) -> None:
    """Refuse (exit 2, naming each failing expectation) a dataset that does not pass the expectation suites,
    before anything is written."""
    import os

    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    from arl_models.data import DatasetError
    from tasks.validate import validate_dataset_dir

    try:
        report = validate_dataset_dir(data)
    except DatasetError as e:
        fail(str(e))
    if not report.success:
        fail(f"the dataset failed validation; nothing was trained.\n{report.summary()}")


def _train(stage: str, data: Path, out: Path, preset: str, threads: int | None, **kw: Any) -> None:
    """Train ``stage`` (``bc`` or an offline algorithm) and print its final metrics."""
    from functools import partial

    from arl_models.data import DatasetError
    from arl_models.offline import train_bc, train_offline_algo
    from arl_models.presets import apply_threads
    from arl_models.train import TrainingDiverged

    _require_valid(data)
    apply_threads(preset, threads)
    fn = train_bc if stage == "bc" else partial(train_offline_algo, stage)
    try:
        final = fn(data, out, preset=preset, **kw)
    except (DatasetError, KeyError, ValueError, FileNotFoundError, TrainingDiverged) as e:
        fail(str(e))
    typer.echo(json.dumps({k: round(v, 4) for k, v in final.items()}, indent=2))


_RUN = ("seed", "steps", "init_actor", "constrained", "context_dim", "restart")
"""The options every stage-2 command passes to ``train_offline_algo`` as they are."""


def _train_stage2(algo: str, ctx: typer.Context, *fields: str) -> None:
    """Train stage-2 ``algo`` with the command's options; ``fields`` name those that set its config (unset:
    the preset's)."""
    p = ctx.params
    cfg = _preset_config(algo, p["preset"], **{f: p[f] for f in fields})
    _train(algo, p["data"], p["out"], p["preset"], p["threads"], config=cfg, **{k: p[k] for k in _RUN})


@app.command("bc")
def train_bc_cmd(
    data: Data,
    out: Out,
    preset: Preset = _BC.preset,
    seed: Seed = _BC.seed,
    steps: Steps = None,
    policy: Annotated[
        str | None,
        typer.Option(
            help="gaussian (likelihood, actions at the bounds censored) | deterministic (squared error); "
            "default: the preset's."
        ),
    ] = None,
    context_dim: ContextDim = None,
    context_lr_scale: ContextLrScale = None,
    restart: Restart = False,
    threads: Threads = None,
) -> None:
    """Behaviour cloning (stage 1)."""
    cfg = _preset_config("bc", preset, policy=policy, context_lr_scale=context_lr_scale)
    _train(
        "bc",
        data,
        out,
        preset,
        threads,
        seed=seed,
        steps=steps,
        config=cfg,
        context_dim=context_dim,
        restart=restart,
    )


@app.command("cql")
def train_cql_cmd(
    ctx: typer.Context,
    data: Data,
    out: Out,
    preset: Preset = _STAGE2.preset,
    seed: Seed = _STAGE2.seed,
    steps: Steps = None,
    init_actor: InitActor = None,
    constrained: Constrained = _STAGE2.constrained,
    restart: Restart = False,
    threads: Threads = None,
    context_dim: ContextDim = None,
    context_lr_scale: ContextLrScale = None,
    conservative_weight: Annotated[
        float | None,
        typer.Option(
            help="Weight of the conservative term (Kumar et al. 2020; default: the preset's); narrow data, "
            "such as one expert policy's, wants a larger one."
        ),
    ] = None,
) -> None:
    """Conservative Q-learning with a cost critic (stage 2; Kumar et al. 2020)."""
    _train_stage2("cql", ctx, "context_lr_scale", "conservative_weight")


@app.command("td3bc")
def train_td3bc_cmd(
    ctx: typer.Context,
    data: Data,
    out: Out,
    preset: Preset = _STAGE2.preset,
    seed: Seed = _STAGE2.seed,
    steps: Steps = None,
    init_actor: InitActor = None,
    constrained: Constrained = _STAGE2.constrained,
    context_dim: ContextDim = None,
    restart: Restart = False,
    threads: Threads = None,
    alpha: Annotated[
        float | None, typer.Option(help="Weight of the critic against the BC term (default: the preset's).")
    ] = None,
) -> None:
    """TD3+BC with a cost critic (stage 2; Fujimoto and Gu 2021)."""
    _train_stage2("td3bc", ctx, "alpha")


@app.command("iql")
def train_iql_cmd(
    ctx: typer.Context,
    data: Data,
    out: Out,
    preset: Preset = _STAGE2.preset,
    seed: Seed = _STAGE2.seed,
    steps: Steps = None,
    init_actor: InitActor = None,
    constrained: Constrained = _STAGE2.constrained,
    context_dim: ContextDim = None,
    restart: Restart = False,
    threads: Threads = None,
    expectile: Annotated[
        float | None, typer.Option(help="Expectile of Q that V learns (default: the preset's).")
    ] = None,
    beta: Annotated[
        float | None,
        typer.Option(help="Inverse temperature of the advantage weights (default: the preset's)."),
    ] = None,
) -> None:
    """Implicit Q-learning with a cost critic (stage 2; Kostrikov et al. 2022)."""
    _train_stage2("iql", ctx, "expectile", "beta")


@app.command("rebrac")
def train_rebrac_cmd(
    ctx: typer.Context,
    data: Data,
    out: Out,
    preset: Preset = _STAGE2.preset,
    seed: Seed = _STAGE2.seed,
    steps: Steps = None,
    init_actor: InitActor = None,
    constrained: Constrained = _STAGE2.constrained,
    context_dim: ContextDim = None,
    restart: Restart = False,
    threads: Threads = None,
    actor_bc_coef: Annotated[
        float | None,
        typer.Option(help="Weight of the BC penalty in the actor's loss (default: the preset's)."),
    ] = None,
    critic_bc_coef: Annotated[
        float | None,
        typer.Option(help="Weight of the BC penalty in the critic's target (default: the preset's)."),
    ] = None,
) -> None:
    """ReBRAC with a cost critic (stage 2; Tarasov et al. 2023)."""
    _train_stage2("rebrac", ctx, "actor_bc_coef", "critic_bc_coef")


@app.command("offline")
def train_offline_cmd(
    data: Data,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for the two checkpoints: OUT/bc and OUT/ALGO.")
    ],
    preset: Preset = _OFFLINE.preset,
    seed: Seed = _OFFLINE.seed,
    algo: Annotated[
        str | None,
        typer.Option(
            help="cql | td3bc | iql | rebrac (default: the pipeline's stage 2 for the data's task)."
        ),
    ] = None,
    bc_steps: Annotated[int | None, typer.Option(help="BC gradient steps (default: the preset's).")] = None,
    steps: Annotated[
        int | None, typer.Option(help="Stage 2's gradient steps (default: the preset's).")
    ] = None,
    constrained: Constrained = _OFFLINE.constrained,
    restart: Restart = False,
    threads: Threads = None,
) -> None:
    """The pipeline's offline half at its defaults: BC, then stage 2's algorithm from it."""
    from arl_models.data import DatasetError
    from arl_models.offline import train_offline
    from arl_models.presets import apply_threads
    from arl_models.train import TrainingDiverged

    _require_valid(data)
    apply_threads(preset, threads)
    try:
        finals = train_offline(
            data,
            out,
            preset=preset,
            seed=seed,
            algo=algo,
            bc_steps=bc_steps,
            steps=steps,
            constrained=constrained,
            restart=restart,
        )
    except (DatasetError, KeyError, ValueError, FileNotFoundError, TrainingDiverged) as e:
        fail(str(e))
    typer.echo(json.dumps({s: {k: round(v, 4) for k, v in f.items()} for s, f in finals.items()}, indent=2))
