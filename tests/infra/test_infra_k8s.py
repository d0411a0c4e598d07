"""infra/k8s: every rendered manifest validates against the Kubernetes schemas (offline)."""

from __future__ import annotations

import kubernetes_validate
import pytest
from infra_support import K8S_VERSION, load_all

from arl_cli.infra import INFRA_DIR

MANIFESTS = sorted((INFRA_DIR / "k8s").glob("*.yaml"))


def _docs(rendered):
    return [(p.name, d) for p in sorted((rendered / "k8s").glob("*.yaml")) for d in load_all(p)]


def _pod_specs(doc: dict) -> list[dict]:
    """Pod templates inside a manifest, RayCluster's included."""
    spec = doc.get("spec", {})
    if doc["kind"] == "RayCluster":
        groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
        return [g["template"] for g in groups]
    if "template" in spec:
        return [spec["template"]]
    return []


def test_there_are_manifests(rendered):
    kinds = {d["kind"] for _, d in _docs(rendered)}
    assert {"Namespace", "ServiceAccount", "Role", "RoleBinding", "DaemonSet", "Job", "RayCluster"} <= kinds
    assert len(list((rendered / "k8s").glob("*.yaml"))) == len(MANIFESTS)


def test_every_manifest_validates_against_kubernetes_schemas(rendered):
    for _name, doc in _docs(rendered):
        if doc["kind"] == "RayCluster":
            continue  # a CRD: its pod templates are validated below as core PodTemplates
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_raycluster_pod_templates_validate_as_core_pod_templates(rendered):
    ray = next(d for _, d in _docs(rendered) if d["kind"] == "RayCluster")
    assert ray["apiVersion"] == "ray.io/v1"
    for i, template in enumerate(_pod_specs(ray)):
        wrapped = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": f"ray-{i}"},
            "template": template,
        }
        kubernetes_validate.validate(wrapped, K8S_VERSION, strict=True)
    for group in ray["spec"]["workerGroupSpecs"]:
        assert group["template"]["spec"]["nodeSelector"] == {"arl.dev/node-pool": "cpu-epyc"}
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def test_validation_can_fail():
    bad = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "x"},
        "automountServiceAccountToken": "no",
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


# Pods that must run as root, with the reason; checkov skips carry the same reason.
ROOT_ALLOWED = {"nvidia-device-plugin": "writes the kubelet device-plugin socket on the host"}


def test_pods_run_non_root_with_read_only_root_filesystems(rendered):
    for name, doc in _docs(rendered):
        for template in _pod_specs(doc):
            pod = template["spec"]
            if doc["metadata"]["name"] in ROOT_ALLOWED:
                continue
            assert pod["securityContext"]["runAsNonRoot"] is True, name
            assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
            for c in pod["containers"]:
                sc = c["securityContext"]
                assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
                assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
                assert sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
                assert "limits" in c["resources"], (name, c["name"])


def test_rbac_is_namespaced_and_least_privilege(rendered):
    roles = [d for _, d in _docs(rendered) if d["kind"] in ("Role", "ClusterRole")]
    assert roles and all(r["kind"] == "Role" for r in roles)
    for role in roles:
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            assert "secrets" not in rule["resources"]
            assert not {"update", "patch", "escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_gpu_daemonset_lands_on_a100_nodes(rendered):
    ds = next(d for _, d in _docs(rendered) if d["kind"] == "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"arl.dev/node-pool": "gpu-a100"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
