"""``arl serve``: a registered policy behind MLflow's scoring server, run from this environment.

The server is ``mlflow models serve --env-manager local`` started by this interpreter
(``sys.executable -m mlflow``) with this environment's ``bin/`` first on ``PATH``, where MLflow finds the
``uvicorn`` it runs; the model is read from the tracking URI the other commands use (the running ``arl up``
stack, else ``$ARL_HOME/mlflow.db``). Requests and answers are MLflow's: POST ``/invocations`` with
``{"inputs": [[...observation...], ...]}`` answers ``{"predictions": [[...action...], ...]}``; a request of
the wrong width, a non-numeric or non-finite value or no rows answers 400 with a message.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from arl_cli.common import fail
from arl_cli.defaults import library

DEFAULT_ALIAS = library("tasks.registry", "CHAMPION")
_UP = library("tasks.stack", "up")


def _server_env() -> dict[str, str]:
    """This process's environment, plus the running stack's settings where ``arl up`` runs one (values set
    here win), the tracking URI the other commands use, and this interpreter's ``bin/`` first on ``PATH``."""
    from arl_cli.compare import tracking_uri
    from tasks.settings import state_paths
    from tasks.stack import running_urls, stack_env

    env = dict(os.environ)
    paths = state_paths()
    if (urls := running_urls(paths)) is not None:
        env = {**stack_env(paths, urls), **env}
    env["MLFLOW_TRACKING_URI"] = tracking_uri()
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
    return env


def resolve_model(model: str, alias: str | None, tracking_uri: str) -> str:
    """The model URI to serve: a URI (``models:/NAME/3``, ``runs:/...``, a directory) as given; a registered
    model's name as ``models:/NAME/VERSION`` of the version behind ``alias`` (default ``champion``), so the
    server keeps the version it started with when the alias moves."""
    from tasks.registry import alias_version

    if ":" in model or Path(model).exists():
        if alias is not None:
            fail(f"--alias goes with a registered model's name, not with the URI {model!r}")
        return model
    alias = alias or DEFAULT_ALIAS
    version = alias_version(model, alias, tracking_uri=tracking_uri)
    if version is None:
        fail(
            f"no version of model {model!r} has the alias {alias!r} in {tracking_uri} "
            "(`arl pipeline run` registers one; `--alias challenger` serves the other)"
        )
    return f"models:/{model}/{version}"


def _describe(uri: str, tracking_uri: str) -> str:
    """What the model at ``uri`` takes and returns (a warning where it has no signature)."""
    from tasks.registry import describe_signature

    try:
        described = describe_signature(uri, tracking_uri=tracking_uri)
    except ValueError as e:
        fail(str(e))
    if described is None:
        typer.secho(
            f"warning: {uri} has no signature, so a request of the wrong width reaches the policy and "
            "fails with a server error; registering it again writes one",
            fg=typer.colors.YELLOW,
            err=True,
        )
    return described or "no signature"


def serve_cmd(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL_URI_OR_NAME",
            help="A registered model's name (served at --alias) or a model URI: models:/NAME/VERSION, "
            "runs:/ID/policy, a directory.",
        ),
    ],
    alias: Annotated[
        str | None, typer.Option(help=f"The alias whose version to serve (default: {DEFAULT_ALIAS}).")
    ] = None,
    port: Annotated[
        int, typer.Option(help=f"Port to listen on (arl up's MLflow server takes {_UP.mlflow_port}).")
    ] = 5001,
    host: Annotated[
        str, typer.Option(help="Interface to bind (0.0.0.0 listens on every interface).")
    ] = "127.0.0.1",
) -> None:
    """Serve a registered policy over HTTP with MLflow's scoring server (POST /invocations; Ctrl-C stops)."""
    os.environ.update(_server_env())  # the lookups below and the server see one environment
    tracking_uri = os.environ["MLFLOW_TRACKING_URI"]
    uri = resolve_model(model, alias, tracking_uri)
    described = _describe(uri, tracking_uri)
    typer.echo(f"serving {uri} ({described}) from {tracking_uri} at http://{host}:{port}/invocations")
    server = ["mlflow", "models", "serve", "-m", uri, "--env-manager", "local"]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", *server, "--host", host, "--port", str(port)])
