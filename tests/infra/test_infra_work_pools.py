"""Prefect work-pool templates and cluster deployments, checked with Prefect's own machinery.

prefect-kubernetes is not a dependency of the project, so the Kubernetes worker's
job configuration is mirrored below by a BaseJobConfiguration subclass with the
same fields; the template is filled by BaseJobConfiguration.from_template_and_values
(the code path a worker runs), then finished the way KubernetesWorker does
(env dict prepended to the container's env list, default command), and the Job
validated against the Kubernetes schemas.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import kubernetes_validate
import pytest
import yaml
from infra_support import K8S_VERSION
from prefect.server.schemas.actions import WorkPoolCreate
from prefect.utilities.schema_tools import is_valid_schema, validate
from prefect.utilities.templating import find_placeholders
from prefect.workers.base import BaseJobConfiguration
from pydantic import Field

POOLS = ("gpu-a100", "cpu-epyc")


class KubernetesJobConfiguration(BaseJobConfiguration):
    """Fields of prefect_kubernetes.worker.KubernetesWorkerJobConfiguration."""

    namespace: str = Field(default="default")
    job_manifest: dict[str, Any]
    job_watch_timeout_seconds: int | None = None
    pod_watch_timeout_seconds: int = 60
    stream_output: bool = True


class _NoClient:
    """Stands in for the API client: these templates reference no blocks or variables."""

    def __getattr__(self, name):
        raise AssertionError(f"template needed the Prefect API ({name})")


def _template(rendered, pool: str) -> dict:
    return json.loads((rendered / f"prefect/work-pools/{pool}.json").read_text())


def _job(template: dict, values: dict) -> dict:
    config = asyncio.run(
        KubernetesJobConfiguration.from_template_and_values(template, values, client=_NoClient())
    )
    manifest = json.loads(json.dumps(config.job_manifest))
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": k, "value": v} for k, v in config.env.items()] + container["env"]
    if container.get("args") is None:
        container["args"] = ["prefect", "flow-run", "execute"]
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    return manifest


def _mlflow_login(rendered) -> dict[str, dict]:
    """The secretKeyRef each MLflow credential must come from: the Secret of the server's admin."""
    admin = yaml.safe_load((rendered / "helm/mlflow.yaml").read_text())["auth"]["existingAdminSecret"]
    return {
        "MLFLOW_TRACKING_USERNAME": {"name": admin["name"], "key": admin["usernameKey"]},
        "MLFLOW_TRACKING_PASSWORD": {"name": admin["name"], "key": admin["passwordKey"]},
    }


def _assert_mlflow_login_by_reference(manifest: dict, login: dict[str, dict]) -> None:
    for container in manifest["spec"]["template"]["spec"]["containers"]:
        entries = [e for e in container["env"] if e["name"] in login]
        assert sorted(e["name"] for e in entries) == sorted(login), container["name"]
        for entry in entries:
            assert entry == {"name": entry["name"], "valueFrom": {"secretKeyRef": login[entry["name"]]}}


FLOW_RUN_VALUES = {
    "name": "bc-cql-7f3a",
    "labels": {"prefect.io/flow-run-id": "0f5e8a52-5f07-4b5e-8d0b-1d1c2b3a4e5f"},
    "env": {"PREFECT_API_URL": "http://prefect-server.arl.svc.cluster.local:4200/api"},
}


@pytest.mark.parametrize("pool", POOLS)
def test_prefect_accepts_the_base_job_template(rendered, pool):
    template = _template(rendered, pool)
    WorkPoolCreate(name=pool, type="kubernetes", base_job_template=template)
    declared = set(template["variables"]["properties"])
    used = {p.name for p in find_placeholders(json.dumps(template["job_configuration"]))}
    assert used <= declared, used - declared
    assert declared <= used, f"declared but unused: {declared - used}"
    is_valid_schema(template["variables"], preprocess=False)
    defaults = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    validate(defaults, template["variables"], raise_on_error=True, preprocess=True, ignore_required=True)


def test_undeclared_variable_is_rejected(rendered):
    template = _template(rendered, "gpu-a100")
    del template["variables"]["properties"]["gpu_count"]
    with pytest.raises(ValueError, match="gpu_count"):
        WorkPoolCreate(name="broken", type="kubernetes", base_job_template=template)


def test_gpu_pool_job_lands_on_a100_nodes(rendered):
    manifest = _job(_template(rendered, "gpu-a100"), {**FLOW_RUN_VALUES, "gpu_count": 4, "shm_size": "64Gi"})
    pod = manifest["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"arl.dev/node-pool": "gpu-a100"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    resources = pod["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 4
    assert resources["requests"]["nvidia.com/gpu"] == 4
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]
    assert manifest["metadata"]["generateName"] == "bc-cql-7f3a-"
    assert pod["containers"][0]["image"].endswith("/arl:0.1.0")
    assert pod["containers"][0]["env"][0]["name"] == "PREFECT_API_URL"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


def test_there_is_no_other_pool(rendered):
    assert sorted(p.stem for p in (rendered / "prefect/work-pools").glob("*.json")) == sorted(POOLS)


@pytest.mark.parametrize("pool", POOLS)
def test_flow_runs_log_in_to_mlflow_by_secret_reference(rendered, pool):
    _assert_mlflow_login_by_reference(
        _job(_template(rendered, pool), FLOW_RUN_VALUES), _mlflow_login(rendered)
    )


def test_an_mlflow_password_by_value_is_caught(rendered):
    template = _template(rendered, "cpu-epyc")
    env = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]["env"]
    entry = next(e for e in env if e["name"] == "MLFLOW_TRACKING_PASSWORD")
    entry.pop("valueFrom")
    entry["value"] = "not-a-reference"
    with pytest.raises(AssertionError):
        _assert_mlflow_login_by_reference(_job(template, FLOW_RUN_VALUES), _mlflow_login(rendered))
    flow_env = {**FLOW_RUN_VALUES, "env": {"MLFLOW_TRACKING_PASSWORD": "from-the-deployment"}}
    with pytest.raises(AssertionError):
        _assert_mlflow_login_by_reference(
            _job(_template(rendered, "cpu-epyc"), flow_env), _mlflow_login(rendered)
        )


def test_gpu_count_outside_the_node_is_refused(rendered):
    template = _template(rendered, "gpu-a100")
    with pytest.raises(Exception, match="gpu_count"):
        validate({"gpu_count": 9}, template["variables"], raise_on_error=True, ignore_required=True)


def test_epyc_pool_job_lands_on_epyc_nodes_without_gpus(rendered):
    manifest = _job(_template(rendered, "cpu-epyc"), {**FLOW_RUN_VALUES, "cpu": "16", "memory": "32Gi"})
    pod = manifest["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"arl.dev/node-pool": "cpu-epyc"}
    assert not pod.get("tolerations")
    resources = pod["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "16", "memory": "32Gi"}
    assert resources["limits"] == {"cpu": "16", "memory": "32Gi"}
    assert "nvidia.com/gpu" not in json.dumps(resources)


def test_cluster_deployments_use_the_pools_and_valid_job_variables(rendered, settings):
    doc = yaml.safe_load((rendered / "prefect/cluster-deployments.yaml").read_text())
    pools = {p: _template(rendered, p) for p in POOLS}
    by_pool_name = {settings["gpu_pool"]["name"]: "gpu-a100", settings["epyc_pool"]["name"]: "cpu-epyc"}
    login = _mlflow_login(rendered)
    placement = {}
    for dep in doc["deployments"]:
        path, _, func = dep["entrypoint"].partition(":")
        assert path.startswith("flows/") and path.endswith(".py") and func
        pool = by_pool_name[dep["work_pool"]["name"]]
        job_vars = dep["work_pool"]["job_variables"]
        validate(
            job_vars, pools[pool]["variables"], raise_on_error=True, preprocess=True, ignore_required=True
        )
        _assert_mlflow_login_by_reference(_job(pools[pool], {**FLOW_RUN_VALUES, **job_vars}), login)
        placement[func] = pool
    assert placement == {
        "offline_to_online_flow": "gpu-a100",
        "retrain_on_new_data_flow": "gpu-a100",
        "ingest_flow": "cpu-epyc",
    }
