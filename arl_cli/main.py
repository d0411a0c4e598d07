"""The ``arl`` command: a thin face over the library, the tasks and the flows.

Heavy imports (torch, gymnasium, prefect, mlflow, great_expectations) happen inside the commands, so
``arl --help`` answers at once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    help="Offline-to-online RL training: data, BC, CQL, evaluation and the orchestrated pipeline.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
data_app = typer.Typer(help="Generate, import, inspect and validate datasets.", no_args_is_help=True)
train_app = typer.Typer(
    help="Train one stage on a dataset and write a checkpoint directory.", no_args_is_help=True
)
app.add_typer(data_app, name="data")
app.add_typer(train_app, name="train")

Task = Annotated[
    str, typer.Option("--task", "-t", help="Task name, optionally with a version: safe-hopper@1.1.0.")
]
Seed = Annotated[int, typer.Option(help="Random seed (uint32).")]


def _fail(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


@app.command("tasks")
def tasks_cmd() -> None:
    """List the registered tasks, their versions, budgets and dynamics."""
    from arl_models.envs import get_task, task_names, task_versions

    typer.echo(f"{'task@version':28s} {'environment':16s} {'budget':>6s}  dynamics")
    for name in task_names():
        for v in task_versions(name):
            s = get_task(name, v)
            typer.echo(f"{s.key:28s} {s.env_id:16s} {s.cost_budget:6.1f}  {s.description}")


@data_app.command("generate")
def data_generate(
    task: Task,
    quality: Annotated[
        str, typer.Option("--quality", "-q", help="random | medium | expert | medium-replay | medium-expert")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Dataset directory to write (atomically).")],
    transitions: Annotated[
        int, typer.Option(help="Transitions to collect (medium-replay takes the replay as it is).")
    ] = 100_000,
    seed: Seed = 0,
    behaviour_steps: Annotated[
        int | None, typer.Option(help="Steps of the behaviour SAC run (task default if unset).")
    ] = None,
    behaviour_dir: Annotated[
        Path | None, typer.Option(help="Where the behaviour run is cached (default ~/.cache/arl/behaviour).")
    ] = None,
    cost_penalty: Annotated[
        float,
        typer.Option(
            help="k >= 0: the behaviour SAC learns reward - k * cost and its snapshots are ranked by it, so the data "
            "hold episodes within the cost budget (safe-hopper: at 4 a step over the speed limit is a loss below 4.7 m/s)."
        ),
    ] = 0.0,
) -> None:
    """Generate a dataset the D4RL way, with behaviour policies trained by the project's SAC."""
    from arl_models.data.generate import generate_dataset

    try:
        info = generate_dataset(
            task,
            quality,
            out,
            transitions=transitions,
            seed=seed,
            behaviour_steps=behaviour_steps,
            behaviour_dir=behaviour_dir,
            cost_penalty=cost_penalty,
        )
    except (KeyError, ValueError) as e:
        _fail(str(e))
    typer.echo(
        f"wrote {out}: {info.task}@{info.env_version} {info.quality}, "
        f"reference returns random {info.ref_random_return:.1f} / expert {info.ref_expert_return:.1f}"
    )


@data_app.command("import")
def data_import(
    source: Annotated[Path, typer.Argument(help="A Minari dataset directory or a D4RL-style .hdf5 file.")],
    task: Task,
    out: Annotated[Path, typer.Option("--out", "-o", help="Dataset directory to write (atomically).")],
    fmt: Annotated[
        str, typer.Option("--format", help="minari | d4rl (default: guessed from the path).")
    ] = "",
    quality: Annotated[
        str,
        typer.Option(
            help="The data's quality label in the sidecar: random | medium | expert | medium-replay | medium-expert | imported."
        ),
    ] = "imported",
    seed: Seed = 0,
    ref_random: Annotated[
        float | None,
        typer.Option(help="Reference return of a random policy (normalised score 0); with --ref-expert."),
    ] = None,
    ref_expert: Annotated[
        float | None,
        typer.Option(
            help="Reference return of an expert (normalised score 100); with --ref-random. Without both, the task's "
            "references: D4RL's for the nominal velocity tasks, else measured from a cached behaviour run."
        ),
    ] = None,
) -> None:
    """Import an existing dataset into the project's Parquet format."""
    from arl_models.data.importers import import_d4rl, import_minari

    if (ref_random is None) != (ref_expert is None):
        _fail("--ref-random and --ref-expert go together: give both or neither")
    kind = fmt or ("minari" if source.is_dir() else "d4rl")
    fn = {"minari": import_minari, "d4rl": import_d4rl}.get(kind)
    if fn is None:
        _fail(f"unknown --format {kind!r}: use minari or d4rl")
    refs = None if ref_random is None or ref_expert is None else (ref_random, ref_expert)
    try:
        info = fn(source, task, out, quality=quality, seed=seed, ref_scores=refs)
    except (KeyError, OSError, ValueError) as e:  # ValueError includes DatasetError
        _fail(str(e))
    typer.echo(f"wrote {out}: {info.num_transitions} transitions in {info.num_episodes} episodes")
    if info.ref_random_return is None or info.ref_expert_return is None:
        typer.echo(
            f"reference returns: {info.extra['references']} (no normalised scores; pass --ref-random and --ref-expert)"
        )
    else:
        typer.echo(
            f"reference returns: random {info.ref_random_return:.1f} / expert {info.ref_expert_return:.1f} "
            f"({info.ref_source}: {info.extra['references']})"
        )


@data_app.command("relabel")
def data_relabel(
    source: Annotated[Path, typer.Argument(help="A dataset directory.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Dataset directory to write (atomically).")],
) -> None:
    """Recompute a dataset's cost column with its task's current cost function (for data labelled
    before the task's cost changed); rows and version metadata are kept."""
    from arl_models.data.dataset import DatasetError
    from arl_models.data.importers import relabel_costs

    try:
        info = relabel_costs(source, out)
    except (DatasetError, KeyError, OSError) as e:
        _fail(str(e))
    typer.echo(f"wrote {out}: costs by {info.extra['cost_fn']} (were: {info.extra['relabelled_from']})")


@data_app.command("merge")
def data_merge(
    sources: Annotated[
        list[Path], typer.Argument(help="Two or more dataset directories of one task version.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Dataset directory to write (atomically).")],
) -> None:
    """Concatenate datasets of one task version (say, a safe and a fast behaviour) into one of quality
    ``mixed``; every row keeps its own version metadata."""
    from arl_models.data.dataset import DatasetError, merge_datasets

    try:
        info = merge_datasets(list(sources), out)
    except (DatasetError, ValueError, OSError) as e:
        _fail(str(e))
    typer.echo(
        f"wrote {out}: {info.num_transitions} transitions, {info.num_episodes} episodes from {len(sources)} datasets"
    )


@data_app.command("info")
def data_info(path: Path, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Show a dataset's sidecar and episode statistics (after checking its schema)."""
    from arl_models.data import DatasetError, read_dataset

    try:
        t, info = read_dataset(path)
    except DatasetError as e:
        _fail(str(e))
    rets, costs = t.episode_returns(), t.episode_costs()
    summary = {
        **info.__dict__,
        "episode_return_mean": float(rets.mean()),
        "episode_cost_mean": float(costs.mean()),
        "env_versions": sorted(set(t.env_version.tolist())),
        "policy_hashes": len(set(t.policy_hash.tolist())),
    }
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    for k, v in summary.items():
        typer.echo(f"{k:22s} {v}")


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
        _fail(str(e))
    if not report.success:
        _fail(f"the dataset failed validation; nothing was trained.\n{report.summary()}")


def _train_common(
    stage: str,
    data: Path,
    out: Path,
    preset: str,
    seed: int,
    steps: int | None,
    threads: int | None = None,
    **kw,
) -> None:
    from functools import partial

    from arl_models.data import DatasetError
    from arl_models.offline import train_bc, train_offline_algo
    from arl_models.presets import apply_threads
    from arl_models.train import TrainingDiverged

    _require_valid(data)
    apply_threads(preset, threads)
    fn = train_bc if stage == "bc" else partial(train_offline_algo, stage)
    try:
        final = fn(data, out, preset=preset, seed=seed, steps=steps, **kw)
    except (DatasetError, KeyError, ValueError, FileNotFoundError, TrainingDiverged) as e:
        _fail(str(e))
    typer.echo(json.dumps({k: round(v, 4) for k, v in final.items()}, indent=2))


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
        help="Checkpoint directory; one holding a run of the same settings and data is resumed, one of others refused.",
    ),
]
Restart = Annotated[
    bool, typer.Option("--restart", help="Discard the checkpoint in --out and train from scratch.")
]
Threads = Annotated[int | None, typer.Option(help="torch threads of the learner (default: the preset's, 1).")]
Preset = Annotated[str, typer.Option(help="demo (small, minutes on 2 cores) | paper (d3rlpy/CORL sizes).")]
Steps = Annotated[int | None, typer.Option(help="Gradient steps (preset default if unset).")]
ContextDim = Annotated[
    int | None,
    typer.Option(
        help="Trailing observation entries that describe the plant and condition the networks (FiLM); "
        "default: what the dataset's task observes (3 on the 2.x versions, else 0); 0 turns it off."
    ),
]
ContextLrScale = Annotated[
    float | None,
    typer.Option(
        help="Learning rate of the FiLM weights as a multiple of their network's (default: the preset's, 30; "
        "1.0 for checkpoints trained before the scale existed)."
    ),
]


InitActor = Annotated[Path | None, typer.Option(help="A BC checkpoint to start the actor from.")]
Constrained = Annotated[bool, typer.Option(help="Hold the actor to the dataset's cost budget (Lagrangian).")]


@train_app.command("bc")
def train_bc_cmd(
    data: Data,
    out: Out,
    preset: Preset = "demo",
    seed: Seed = 0,
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
    _train_common(
        "bc",
        data,
        out,
        preset,
        seed,
        steps,
        config=cfg,
        context_dim=context_dim,
        restart=restart,
        threads=threads,
    )


@train_app.command("cql")
def train_cql_cmd(
    data: Data,
    out: Out,
    preset: Preset = "demo",
    seed: Seed = 0,
    steps: Steps = None,
    init_actor: InitActor = None,
    constrained: Constrained = True,
    restart: Restart = False,
    threads: Threads = None,
    context_dim: ContextDim = None,
    context_lr_scale: ContextLrScale = None,
    conservative_weight: Annotated[
        float | None,
        typer.Option(
            help="Weight of the conservative term (default: the preset's, 5). Narrow data, one expert policy, wants "
            "more: 20 kept a behaviour-cloned start on Pendulum expert data (benchmarks/README.md)."
        ),
    ] = None,
) -> None:
    """Conservative Q-learning with a cost critic (stage 2)."""
    cfg = _preset_config(
        "cql", preset, context_lr_scale=context_lr_scale, conservative_weight=conservative_weight
    )
    _train_common(
        "cql",
        data,
        out,
        preset,
        seed,
        steps,
        init_actor=init_actor,
        constrained=constrained,
        context_dim=context_dim,
        config=cfg,
        restart=restart,
        threads=threads,
    )


@train_app.command("td3bc")
def train_td3bc_cmd(
    data: Data,
    out: Out,
    preset: Preset = "demo",
    seed: Seed = 0,
    steps: Steps = None,
    init_actor: InitActor = None,
    constrained: Constrained = True,
    context_dim: ContextDim = None,
    restart: Restart = False,
    threads: Threads = None,
    alpha: Annotated[
        float | None, typer.Option(help="Weight of the critic against the BC term (default: the preset's).")
    ] = None,
) -> None:
    """TD3+BC with a cost critic (stage 2; Fujimoto and Gu 2021)."""
    cfg = _preset_config("td3bc", preset, alpha=alpha)
    _train_common(
        "td3bc",
        data,
        out,
        preset,
        seed,
        steps,
        init_actor=init_actor,
        constrained=constrained,
        context_dim=context_dim,
        config=cfg,
        restart=restart,
        threads=threads,
    )


@train_app.command("iql")
def train_iql_cmd(
    data: Data,
    out: Out,
    preset: Preset = "demo",
    seed: Seed = 0,
    steps: Steps = None,
    init_actor: InitActor = None,
    constrained: Constrained = True,
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
    cfg = _preset_config("iql", preset, expectile=expectile, beta=beta)
    _train_common(
        "iql",
        data,
        out,
        preset,
        seed,
        steps,
        init_actor=init_actor,
        constrained=constrained,
        context_dim=context_dim,
        config=cfg,
        restart=restart,
        threads=threads,
    )


@train_app.command("offline")
def train_offline_cmd(
    data: Data,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory for the two checkpoints: OUT/bc and OUT/<algo>.")
    ],
    preset: Preset = "demo",
    seed: Seed = 0,
    algo: Annotated[
        str | None, typer.Option(help="cql | td3bc | iql (default: the preset's, the pipeline's stage 2).")
    ] = None,
    bc_steps: Annotated[int | None, typer.Option(help="BC gradient steps (preset default if unset).")] = None,
    steps: Annotated[
        int | None, typer.Option(help="Stage 2's gradient steps (preset default if unset).")
    ] = None,
    constrained: Constrained = True,
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
        _fail(str(e))
    typer.echo(json.dumps({s: {k: round(v, 4) for k, v in f.items()} for s, f in finals.items()}, indent=2))


@app.command("evaluate")
def evaluate_cmd(
    policy: Annotated[Path, typer.Option("--policy", "-p", help="A checkpoint directory.")],
    task: Annotated[
        str | None, typer.Option("--task", "-t", help="Task (default: the policy's own).")
    ] = None,
    episodes: int = 10,
    seed: Seed = 12345,
    as_json: Annotated[bool, typer.Option("--json", help="Print the full result as JSON.")] = False,
) -> None:
    """Run vectorised episodes: return, normalised score, mean episode cost, share over budget."""
    from arl_models.offline import evaluate_checkpoint

    try:
        res = evaluate_checkpoint(policy, task, episodes=episodes, seed=seed)
    except (KeyError, FileNotFoundError) as e:
        _fail(str(e))
    if as_json:
        typer.echo(json.dumps(res.to_dict(), indent=2))
        return
    norm = "n/a" if res.normalized_score is None else f"{res.normalized_score:.1f}"
    typer.echo(
        f"{res.task}@{res.env_version}: return {res.mean_return:.1f} ± {res.std_return:.1f}, normalised {norm}, "
        f"cost {res.mean_cost:.1f} (budget {res.cost_budget:g}, {100 * res.over_budget_share:.0f}% of episodes over)"
    )


def _mount() -> None:
    """The other faces: cluster templates, the orchestrated pipeline, the online stages."""
    import importlib

    for module, name in (("arl_cli.infra", "infra"), ("arl_cli.pipeline", "pipeline")):
        app.add_typer(importlib.import_module(module).app, name=name)
    pipeline = importlib.import_module("arl_cli.pipeline")  # light: typer only
    app.command("up")(pipeline.up_cmd)
    app.command("down")(pipeline.down_cmd)
    app.command("compare")(pipeline.compare_cmd)
    data_app.command("validate")(pipeline.validate_cmd)
    data_app.command("push")(pipeline.push_cmd)
    online = importlib.import_module("arl_cli.online")
    app.command("finetune")(online.finetune_cmd)
    app.command("continual")(online.continual_cmd)
    app.command("doctor")(importlib.import_module("arl_cli.doctor").doctor_cmd)
    app.command("serve")(importlib.import_module("arl_cli.serve").serve_cmd)


_mount()

if __name__ == "__main__":
    app()
