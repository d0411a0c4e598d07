"""``arl data``: generate, import, relabel, merge, inspect, validate and push datasets.

Mounted by ``arl_cli.main``; ``validate`` and ``push`` are the pipeline's (``arl_cli.pipeline``). Heavy
imports happen inside the commands; the options' defaults are the library's (:mod:`arl_cli.defaults`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from arl_cli import pipeline
from arl_cli.common import App, DatasetOut, Seed, Task, Threads, fail
from arl_cli.defaults import library

app = App(help="Generate, import, inspect, validate and push datasets.")

_GENERATE = library("arl_models.data.generate", "generate_dataset")
_IMPORT = library("arl_models.data.importers", "import_d4rl")
_QUALITIES = " | ".join(library("arl_models.data.generate", "QUALITIES"))


@app.command("generate")
def data_generate(
    task: Task,
    quality: Annotated[str, typer.Option("--quality", "-q", help=f"The behaviour's quality: {_QUALITIES}.")],
    out: DatasetOut,
    transitions: Annotated[
        int, typer.Option(help="Transitions to collect (medium-replay takes the replay as it is).")
    ] = _GENERATE.transitions,
    seed: Seed = _GENERATE.seed,
    behaviour_steps: Annotated[
        int | None, typer.Option(help="Steps of the behaviour SAC run (default: the task's).")
    ] = None,
    behaviour_dir: Annotated[
        Path | None,
        typer.Option(help="Where the behaviour run is cached (default: under ~/.cache/arl/behaviour)."),
    ] = None,
    cost_penalty: Annotated[
        float,
        typer.Option(
            help="k >= 0: the behaviour SAC learns reward - k * cost and its snapshots are ranked by it, so "
            "the data hold episodes within the cost budget, as DSRL's do (on safe-hopper, k = 4 makes a "
            "step over the speed limit a loss below 4.7 m/s)."
        ),
    ] = _GENERATE.cost_penalty,
    threads: Threads = None,
) -> None:
    """Generate a dataset the D4RL way, with behaviour policies trained by the project's SAC."""
    from arl_models.data.generate import generate_dataset
    from arl_models.presets import apply_threads

    apply_threads(threads=threads)  # the behaviour SAC is a learner like the stages

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
        fail(str(e))
    typer.echo(
        f"wrote {out}: {info.task}@{info.env_version} {info.quality}, "
        f"reference returns random {info.ref_random_return:.1f} / expert {info.ref_expert_return:.1f}"
    )


@app.command("import")
def data_import(
    source: Annotated[Path, typer.Argument(help="A Minari dataset directory or a D4RL-style .hdf5 file.")],
    task: Task,
    out: DatasetOut,
    fmt: Annotated[
        str, typer.Option("--format", help="minari | d4rl (default: guessed from the path).")
    ] = "",
    quality: Annotated[
        str,
        typer.Option(help=f"The data's quality label in its sidecar: {_QUALITIES} | imported."),
    ] = _IMPORT.quality,
    seed: Seed = _IMPORT.seed,
    ref_random: Annotated[
        float | None,
        typer.Option(help="Reference return of a random policy (normalised score 0); with --ref-expert."),
    ] = None,
    ref_expert: Annotated[
        float | None,
        typer.Option(
            help="Reference return of an expert (normalised score 100); with --ref-random. Without both, "
            "the task's: D4RL's for the nominal velocity tasks, else measured from a cached behaviour run."
        ),
    ] = None,
) -> None:
    """Import an existing dataset into the project's Parquet format."""
    from arl_models.data.importers import import_d4rl, import_minari

    if (ref_random is None) != (ref_expert is None):
        fail("--ref-random and --ref-expert go together: give both or neither")
    kind = fmt or ("minari" if source.is_dir() else "d4rl")
    fn = {"minari": import_minari, "d4rl": import_d4rl}.get(kind)
    if fn is None:
        fail(f"unknown --format {kind!r}: use minari or d4rl")
    refs = None if ref_random is None or ref_expert is None else (ref_random, ref_expert)
    try:
        info = fn(source, task, out, quality=quality, seed=seed, ref_scores=refs)
    except (KeyError, OSError, ValueError) as e:  # ValueError includes DatasetError
        fail(str(e))
    typer.echo(f"wrote {out}: {info.num_transitions} transitions in {info.num_episodes} episodes")
    if info.ref_random_return is None or info.ref_expert_return is None:
        typer.echo(
            f"reference returns: {info.extra['references']} "
            "(no normalised scores; pass --ref-random and --ref-expert)"
        )
    else:
        typer.echo(
            f"reference returns: random {info.ref_random_return:.1f} / expert {info.ref_expert_return:.1f} "
            f"({info.ref_source}: {info.extra['references']})"
        )


@app.command("relabel")
def data_relabel(
    source: Annotated[Path, typer.Argument(help="A dataset directory.")],
    out: DatasetOut,
) -> None:
    """Recompute a dataset's cost column with its task's current cost function, keeping rows and metadata.

    For data labelled before the task's cost function changed.
    """
    from arl_models.data.dataset import DatasetError
    from arl_models.data.importers import relabel_costs

    try:
        info = relabel_costs(source, out)
    except (DatasetError, KeyError, OSError) as e:
        fail(str(e))
    typer.echo(f"wrote {out}: costs by {info.extra['cost_fn']} (were: {info.extra['relabelled_from']})")


@app.command("merge")
def data_merge(
    sources: Annotated[
        list[Path], typer.Argument(help="Two or more dataset directories of one task version.")
    ],
    out: DatasetOut,
) -> None:
    """Concatenate datasets of one task version into one of quality mixed; rows keep their own metadata."""
    from arl_models.data.dataset import DatasetError, merge_datasets

    try:
        info = merge_datasets(list(sources), out)
    except (DatasetError, ValueError, OSError) as e:
        fail(str(e))
    typer.echo(
        f"wrote {out}: {info.num_transitions} transitions, {info.num_episodes} episodes "
        f"from {len(sources)} datasets"
    )


@app.command("info")
def data_info(
    path: Annotated[Path, typer.Argument(help="A dataset directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Show a dataset's sidecar and episode statistics (after checking its schema)."""
    from arl_models.data import DatasetError, read_dataset

    try:
        t, info = read_dataset(path)
    except DatasetError as e:
        fail(str(e))
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


app.command("validate")(pipeline.validate_cmd)
app.command("push")(pipeline.push_cmd)
