"""Helpers shared by the infra/ tests (a uniquely named module, not conftest)."""

from __future__ import annotations

from pathlib import Path

import yaml

# The Kubernetes version the manifests are validated against: the cluster's
# default (terraform/variables.tf), bundled by kubernetes-validate.
K8S_VERSION = "1.33.0"

FAKE_TF_OUTPUTS = {
    "ecr_repository_url": {"value": "111122223333.dkr.ecr.us-east-1.amazonaws.com/arl"},
    "db_address": {"value": "arl-postgres.abcdefghijkl.us-east-1.rds.amazonaws.com"},
    "db_port": {"value": 5432},
    "db_master_secret_arn": {"value": "arn:aws:secretsmanager:us-east-1:111122223333:secret:rds!db-x"},
}


def load_all(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
