"""`arl infra render`: fill the cluster templates in infra/ from one settings file.

Templates are the files under infra/k8s, infra/helm and infra/prefect. Their
placeholders are ``${dotted.key}`` (string.Template syntax, braced form only, ``$$``
for a literal ``$``); Prefect's own ``{{ var }}`` placeholders pass through untouched.
Values come from the settings file, from a few derived keys (``image.ref``) and, after
``terraform apply``, from ``terraform output -json`` under ``tf.<name>``.
Work-pool templates are written as JSON (what Prefect and the worker chart take);
Terraform gets ``terraform/terraform.tfvars.json``.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from arl_cli.common import App

INFRA_DIR = Path(__file__).resolve().parent.parent / "infra"
TEMPLATE_DIRS = ("k8s", "helm", "prefect")
TF_OUTPUTS = ("ecr_repository_url", "db_address", "db_port", "db_master_secret_arn")
PENDING = "pending-terraform-output-"


class _Template(string.Template):
    # Only ${a.b.c} and $$: bare $NAME (shell, Ray commands) stays as it is.
    pattern = (
        r"""\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_.]*)\}|(?P<named>(?!))|(?P<invalid>(?!)))"""
    )


class _Context(dict):
    """Flat ``{"a.b": value}`` view of nested settings; unknown keys raise KeyError."""

    def __init__(self, nested: dict[str, Any]):
        super().__init__()

        def walk(prefix: str, node: Any) -> None:
            if isinstance(node, dict):
                for key, value in node.items():
                    walk(f"{prefix}{key}.", value)
            self[prefix.rstrip(".")] = node

        walk("", nested)

    def __getitem__(self, key: str) -> str:
        value = super().__getitem__(key)
        return value if isinstance(value, str) else json.dumps(value)


def load_terraform_outputs(path: Path | None) -> dict[str, Any]:
    """Read ``terraform output -json``; missing outputs become visible placeholders."""
    raw = json.loads(path.read_text()) if path else {}
    outputs = {name: PENDING + name for name in TF_OUTPUTS}
    outputs.update({k: (v["value"] if isinstance(v, dict) and "value" in v else v) for k, v in raw.items()})
    return outputs


def build_context(settings: dict[str, Any], tf_outputs: dict[str, Any]) -> dict[str, Any]:
    ctx = json.loads(json.dumps(settings))  # deep copy, plain types only
    ctx["tf"] = tf_outputs
    image = ctx.setdefault("image", {})
    repository = image.get("repository") or tf_outputs["ecr_repository_url"]
    image["repository"] = repository
    image["ref"] = f"{repository}:{image.get('tag', 'latest')}"
    return ctx


def terraform_vars(settings: dict[str, Any]) -> dict[str, Any]:
    """The Terraform input variables that the settings file decides."""
    c, ng, db = settings["cluster"], settings["node_groups"], settings.get("database", {})
    tfvars = {
        "cluster_name": c["name"],
        "region": c["region"],
        "kubernetes_version": str(c["kubernetes_version"]),
        "endpoint_public_access_cidrs": list(c["api_allowed_cidrs"]),
        "namespace": settings["namespace"],
        "dvc_bucket_name": settings["buckets"]["dvc"],
        "mlflow_bucket_name": settings["buckets"]["mlflow"],
        "gpu_instance_types": ng["gpu"]["instance_types"],
        "gpu_capacity_type": ng["gpu"].get("capacity_type", "ON_DEMAND"),
        "cpu_instance_types": ng["cpu"]["instance_types"],
        "system_instance_types": ng["system"]["instance_types"],
    }
    for group in ("gpu", "cpu", "system"):
        for bound in ("min", "max", "desired"):
            tfvars[f"{group}_{bound}_size"] = int(ng[group][bound])
    for key, var in (
        ("instance_class", "db_instance_class"),
        ("allocated_storage_gb", "db_allocated_storage"),
        ("multi_az", "db_multi_az"),
        ("deletion_protection", "db_deletion_protection"),
    ):
        if key in db:
            tfvars[var] = db[key]
    return tfvars


def render_text(text: str, context: dict[str, Any]) -> str:
    """Substitute ``${dotted.key}`` placeholders; an unknown key raises KeyError."""
    return _Template(text).substitute(_Context(context))


def render(
    settings_path: Path,
    out_dir: Path,
    terraform_outputs: Path | None = None,
    infra_dir: Path = INFRA_DIR,
) -> list[Path]:
    """Render every template under ``infra_dir`` into ``out_dir``; return the files written."""
    settings = yaml.safe_load(Path(settings_path).read_text())
    tf_outputs = load_terraform_outputs(terraform_outputs)
    context = build_context(settings, tf_outputs)
    written: list[Path] = []

    def write(rel: Path, content: str) -> None:
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        written.append(target)

    write(Path("terraform/terraform.tfvars.json"), json.dumps(terraform_vars(settings), indent=2) + "\n")
    for sub in TEMPLATE_DIRS:
        for src in sorted((infra_dir / sub).rglob("*.yaml")):
            rel = src.relative_to(infra_dir)
            try:
                text = render_text(src.read_text(), context)
            except KeyError as exc:
                raise KeyError(f"{rel}: no setting for placeholder ${{{exc.args[0]}}}") from None
            if rel.parts[:2] == ("prefect", "work-pools"):
                write(rel.with_suffix(".json"), json.dumps(yaml.safe_load(text), indent=2) + "\n")
            else:
                write(rel, text)
    return written


def pending_outputs(paths: list[Path]) -> list[str]:
    """Names of Terraform outputs still shown as placeholders in rendered files."""
    found: set[str] = set()
    for path in paths:
        found.update(re.findall(PENDING + r"([a-z_]+)", path.read_text()))
    return sorted(found)


app = App(help="Cluster infrastructure: render the Terraform, Kubernetes, Helm and Prefect templates.")


@app.callback()
def _infra() -> None:
    """Cluster infrastructure (infra/): see infra/README.md."""


@app.command("render")
def render_cmd(
    settings: Annotated[
        Path, typer.Option("--settings", help="Settings file (see infra/settings.example.yaml).")
    ] = INFRA_DIR / "settings.example.yaml",
    out: Annotated[Path, typer.Option("--out", help="Output directory.")] = Path("infra/.rendered"),
    terraform_outputs: Annotated[
        Path | None,
        typer.Option(
            "--terraform-outputs", help="The output of terraform output -json, saved to a file (after apply)."
        ),
    ] = None,
) -> None:
    """Fill every template in infra/ from one settings file."""
    written = render(settings, out, terraform_outputs)
    for path in written:
        typer.echo(str(path))
    pending = pending_outputs(written)
    if pending:
        typer.echo(
            "note: Terraform outputs not given yet (" + ", ".join(pending) + "); after `terraform apply`, "
            "re-run with --terraform-outputs.",
            err=True,
        )


if __name__ == "__main__":
    app()
