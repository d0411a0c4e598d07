"""infra/terraform: parses, is formatted, and says what the issue asks for."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import hcl2
import pytest

from arl_cli.infra import INFRA_DIR

TF_DIR = INFRA_DIR / "terraform"
TF_FILES = sorted(TF_DIR.glob("*.tf"))


def _plain(node):
    """python-hcl2 8.x keeps HCL quotes on labels and strings: strip them."""
    if isinstance(node, dict):
        return {_plain(k): _plain(v) for k, v in node.items() if k != "__is_block__"}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    if isinstance(node, str) and len(node) >= 2 and node[0] == node[-1] == '"':
        return node[1:-1]
    return node


def _load(name: str) -> dict:
    with open(TF_DIR / name) as fh:
        return _plain(hcl2.load(fh))


def _unquote(value):
    return value.strip('"') if isinstance(value, str) else value


@pytest.fixture(scope="module")
def variables() -> dict:
    out = {}
    for block in _load("variables.tf")["variable"]:
        out.update(block)
    return out


@pytest.fixture(scope="module")
def node_groups() -> dict:
    eks = _load("eks.tf")["module"][0]["eks"]
    assert _unquote(eks["source"]) == "terraform-aws-modules/eks/aws"
    assert re.match(r"~> ?2[01]\.", _unquote(eks["version"]))
    return {_unquote(k): v for k, v in eks["eks_managed_node_groups"].items()}


@pytest.mark.parametrize("path", TF_FILES, ids=lambda p: p.name)
def test_every_tf_file_parses(path):
    with open(path) as fh:
        assert hcl2.load(fh)


@pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform not installed")
def test_terraform_fmt_check():
    proc = subprocess.run(
        ["terraform", "fmt", "-check", "-recursive", str(TF_DIR)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_variable_has_a_description(variables):
    assert variables
    for name, spec in variables.items():
        assert _unquote(spec.get("description", "")), name


def test_node_groups_gpu_a100_cpu_epyc_and_system(node_groups, variables):
    assert set(node_groups) == {"system", "gpu-a100", "cpu-epyc"}
    gpu, cpu = node_groups["gpu-a100"], node_groups["cpu-epyc"]
    assert _unquote(gpu["ami_type"]) == "AL2023_x86_64_NVIDIA"
    taint = gpu["taints"]["gpu"]
    assert (_unquote(taint["key"]), _unquote(taint["effect"])) == ("nvidia.com/gpu", "NO_SCHEDULE")
    labels = {_unquote(k): _unquote(v) for k, v in gpu["labels"].items()}
    assert "gpu-a100" in labels.values()
    assert "cpu-epyc" in {_unquote(v) for v in cpu["labels"].values()}
    # Instance types come from variables whose defaults are A100 and AMD EPYC types.
    assert all(t.startswith(("p4d.", "p4de.")) for t in variables["gpu_instance_types"]["default"])
    assert all(re.match(r"^[cmr][5-8]a\.", t) for t in variables["cpu_instance_types"]["default"])
    for group in ("gpu", "cpu", "system"):
        for bound in ("min", "max", "desired"):
            assert f"{group}_{bound}_size" in variables


def test_buckets_are_encrypted_versioned_private():
    storage = _load("storage.tf")
    kinds = {next(iter(r)) for r in storage["resource"]}
    assert {
        "aws_s3_bucket",
        "aws_s3_bucket_versioning",
        "aws_s3_bucket_server_side_encryption_configuration",
        "aws_s3_bucket_public_access_block",
        "aws_s3_bucket_policy",
    } <= kinds
    pab = next(
        r["aws_s3_bucket_public_access_block"]
        for r in storage["resource"]
        if "aws_s3_bucket_public_access_block" in r
    )
    flags = next(iter(pab.values()))
    assert all(
        flags[k] is True
        for k in ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets")
    )


def test_database_is_private_encrypted_and_has_no_password_in_code():
    db = next(r["aws_db_instance"] for r in _load("database.tf")["resource"] if "aws_db_instance" in r)
    pg = next(iter(db.values()))
    assert _unquote(pg["engine"]) == "postgres"
    assert pg["storage_encrypted"] is True and pg["publicly_accessible"] is False
    assert pg["manage_master_user_password"] is True and "password" not in pg


def test_pods_reach_s3_through_pod_identity_not_keys():
    iam = _load("iam.tf")
    kinds = {next(iter(r)) for r in iam["resource"]}
    assert "aws_eks_pod_identity_association" in kinds
    assert "aws_iam_access_key" not in kinds and "aws_iam_user" not in kinds


def test_rendered_tfvars_match_declared_variables(rendered, variables):
    tfvars = json.loads((rendered / "terraform/terraform.tfvars.json").read_text())
    assert set(tfvars) <= set(variables), set(tfvars) - set(variables)
    required = {name for name, spec in variables.items() if "default" not in spec}
    assert required <= set(tfvars), required - set(tfvars)


def test_outputs_cover_what_the_templates_need():
    from arl_cli.infra import TF_OUTPUTS

    outputs = {name for block in _load("outputs.tf")["output"] for name in block}
    assert set(TF_OUTPUTS) <= outputs
