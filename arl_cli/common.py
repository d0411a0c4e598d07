"""What the ``arl`` commands share: the app class their help is drawn by, how a command fails, and the
options several of them take."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand, TyperGroup


class _FlagsTakeNoValue:
    """Help shows a flag (``--json``, ``--constrained/--no-constrained``, ``--help``) without a value
    placeholder, as it takes none; typer 0.29 would show ``<bool>`` beside each."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for p in params:
            if getattr(p, "is_flag", False) and p.metavar is None:
                p.metavar = ""
        return params


class Command(_FlagsTakeNoValue, TyperCommand):
    pass


class Group(_FlagsTakeNoValue, TyperGroup):
    pass


class App(typer.Typer):
    """A typer app whose groups and commands draw their help with :class:`Command` and :class:`Group`;
    given no arguments, it shows its help."""

    def __init__(self, *, help: str, **kwargs: Any):
        super().__init__(cls=Group, help=help, no_args_is_help=True, **kwargs)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kwargs: Any):
        return super().command(name, cls=cls or Command, **kwargs)


def fail(msg: str) -> NoReturn:
    """Print ``error: msg`` to stderr and exit with status 2."""
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


Task = Annotated[
    str, typer.Option("--task", "-t", help="Task name, optionally with a version: safe-hopper@1.1.0.")
]
Seed = Annotated[int, typer.Option(help="Random seed (uint32).")]
Threads = Annotated[int | None, typer.Option(help="torch threads of the learner (default: the preset's).")]
DatasetOut = Annotated[Path, typer.Option("--out", "-o", help="Dataset directory to write (atomically).")]
