"""`arl infra render`: one settings file fills every template, nothing left over."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from arl_cli.infra import INFRA_DIR, app, render, render_text


def test_every_template_is_rendered_without_leftover_placeholders(rendered):
    templates = [p for d in ("k8s", "helm", "prefect") for p in (INFRA_DIR / d).rglob("*.yaml")]
    outputs = [p for p in rendered.rglob("*") if p.is_file() and p.name != "terraform-outputs.json"]
    assert len(outputs) == len(templates) + 1  # + terraform.tfvars.json
    for path in outputs:
        text = path.read_text()
        assert "${" not in text, path
        assert "pending-terraform-output" not in text, path
        if path.suffix == ".json":
            json.loads(text)
        else:
            list(yaml.safe_load_all(text))


def test_settings_values_reach_the_outputs(rendered, settings):
    mlflow = yaml.safe_load((rendered / "helm/mlflow.yaml").read_text())
    assert mlflow["artifactRoot"]["s3"]["bucket"] == settings["buckets"]["mlflow"]
    assert mlflow["backendStore"]["postgres"]["host"].endswith(".rds.amazonaws.com")
    pool = json.loads((rendered / "prefect/work-pools/gpu-a100.json").read_text())
    assert pool["variables"]["properties"]["image"]["default"].endswith("/arl:" + settings["image"]["tag"])
    assert pool["variables"]["properties"]["gpu_count"]["default"] == settings["gpu_pool"]["gpus_per_job"]


def test_prefect_placeholders_and_shell_variables_pass_through():
    text = 'a: "{{ image }}"\nb: ${namespace}\nc: "$HOME and $$literal"\n'
    out = render_text(text, {"namespace": "team-a"})
    assert out == 'a: "{{ image }}"\nb: team-a\nc: "$HOME and $literal"\n'


def test_unknown_placeholder_is_an_error(tmp_path):
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s/x.yaml").write_text("name: ${no.such.key}\n")
    for sub in ("helm", "prefect"):
        (tmp_path / sub).mkdir()
    with pytest.raises(KeyError, match="no.such.key"):
        render(INFRA_DIR / "settings.example.yaml", tmp_path / "out", infra_dir=tmp_path)


def test_cli_render_writes_the_tree_and_names_pending_outputs(tmp_path):
    result = CliRunner().invoke(
        app, ["render", "--settings", str(INFRA_DIR / "settings.example.yaml"), "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "prefect/work-pools/gpu-a100.json").is_file()
    assert (tmp_path / "terraform/terraform.tfvars.json").is_file()
    assert "ecr_repository_url" in result.output  # told to re-run after terraform apply
