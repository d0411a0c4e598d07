"""Shared fixtures for the infra/ checks: one render of the example settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from arl_cli.infra import INFRA_DIR, render

# The Kubernetes version the manifests are validated against: the cluster's
# default (terraform/variables.tf), bundled by kubernetes-validate.
K8S_VERSION = "1.33.0"

FAKE_TF_OUTPUTS = {
    "ecr_repository_url": {"value": "111122223333.dkr.ecr.us-east-1.amazonaws.com/arl"},
    "db_address": {"value": "arl-postgres.abcdefghijkl.us-east-1.rds.amazonaws.com"},
    "db_port": {"value": 5432},
    "db_master_secret_arn": {"value": "arn:aws:secretsmanager:us-east-1:111122223333:secret:rds!db-x"},
}


@pytest.fixture(scope="session")
def settings() -> dict:
    return yaml.safe_load((INFRA_DIR / "settings.example.yaml").read_text())


@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rendered")
    outputs = out / "terraform-outputs.json"
    outputs.write_text(json.dumps(FAKE_TF_OUTPUTS))
    render(INFRA_DIR / "settings.example.yaml", out, outputs)
    return out


def load_all(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
