"""Pushing a dataset version triggers the retraining deployment of prefect.yaml; a process worker runs it.

The deployment is registered from prefect.yaml with ``prefect deploy`` (its trigger, pool and pull step as
written), then given tiny training parameters; a ``prefect worker`` subprocess executes the run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from flow_data import GATE, TINY
from stack_support import ROOT, process_group, run, venv_exe

from tasks import registry, tracking
from tasks.settings import state_paths

pytestmark = pytest.mark.e2e
DEPLOYMENT = "retrain-on-new-data/retrain-on-new-data"
MODEL = "arl-safe-pendulum"
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def worker(prefect_server: str, demo_version: dict, tmp_path_factory: pytest.TempPathFactory):
    """The retraining deployment from prefect.yaml, and a process worker on the ``local`` pool."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate

    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_server,
        "PWD": str(ROOT),
        "PREFECT_WORKER_QUERY_SECONDS": "2",
    }
    created = run("prefect", "work-pool", "create", "local", "--type", "process", "--overwrite", env=env)
    assert created.returncode == 0, created.stdout + created.stderr
    deployed = run("prefect", "--no-prompt", "deploy", "--name", "retrain-on-new-data", env=env)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(DEPLOYMENT)
        client.update_deployment(dep.id, DeploymentUpdate(parameters={"training": TINY, "gate": GATE}))
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    command = [venv_exe("prefect"), "worker", "start", "--pool", "local", "--type", "process"]
    with process_group(command, log, env=env):
        yield dep, log


def test_pushing_a_version_triggers_a_retraining_run_that_a_worker_completes(
    worker, demo_version: dict, tmp_path: Path
) -> None:
    from flow_data import write_pendulum
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from arl_cli.pipeline import push_dataset
    from flows.offline_to_online import offline_to_online_flow
    from flows.params import DatasetRef, GateConfig, TrainingConfig

    dep, log = worker
    # a champion first, so that the pushed version is new data to it: the run continues it (stage 4)
    if registry.alias_version(MODEL, registry.CHAMPION, tracking_uri=state_paths().mlflow_uri) is None:
        offline_to_online_flow(
            DatasetRef(path=demo_version["path"], version=demo_version["md5"]),
            TrainingConfig(**TINY),
            GateConfig(**GATE),
        )
    src = write_pendulum(tmp_path / "pushed", seed=3)
    version = push_dataset(src, state_paths().data_repo)

    deadline, runs = time.monotonic() + TIMEOUT_S, []
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id]))
            )
            if runs and runs[0].state is not None and runs[0].state.is_final():
                break
            time.sleep(2)
    assert runs, f"no run was triggered within {TIMEOUT_S} s; worker log:\n{log.read_text()[-3000:]}"
    (flow_run,) = runs
    assert flow_run.state.is_completed(), f"{flow_run.state}; worker log:\n{log.read_text()[-3000:]}"
    assert flow_run.parameters["dataset"] == {"path": "pushed", "version": version["md5"]}

    c = tracking.client(state_paths().mlflow_uri)
    trained = c.search_model_versions(f"name = '{MODEL}'")
    assert any(v.tags.get("arl.dataset_hash") == version["md5"] for v in trained)
    # the run continued the champion on the new data, and the gate judged the candidate the retraining rule
    # named, saying which and why; the worker's log shows each stage
    gated = [
        v for v in trained if v.tags.get("arl.dataset_hash") == version["md5"] and "arl.promotion" in v.tags
    ]
    (judged,) = [v for v in gated if v.tags["arl.promotion"] in (registry.CHAMPION, registry.CHALLENGER)]
    assert judged.tags["arl.stage"] in ("ewc", "finetune")
    assert judged.tags["arl.promotion.reason"].startswith(f"candidate {judged.tags['arl.stage']}: ")
    ran = {v.tags["arl.stage"] for v in trained if v.tags.get("arl.dataset_hash") == version["md5"]}
    assert "ewc" in ran and ran <= {"ewc", "bc", "offline", "finetune"}
    worker_log = log.read_text()
    assert all(f"stage {s} (" in worker_log for s in ran), worker_log[-3000:]
