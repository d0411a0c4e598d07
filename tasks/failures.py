"""Failure tagging of the pipeline's MLflow run, as Prefect state hooks.

A task hook (:func:`tag_failed_stage`, on every task of the pipeline) tags the parent run with the stage
that failed (``arl.failed_stage``) and its error, or with ``arl.diverged_stage`` when training ran away
(the flow may go on without that stage). The flow hook (:func:`end_failed_pipeline_run`) ends the parent
run ``FAILED``, naming the stage; a failure in no task is the flow's own. The parent run is found by the
Prefect flow run id it is tagged with (``arl.prefect.flow_run_id``).
"""

from __future__ import annotations

import logging
from typing import Any

STAGE_OF_TASK = {
    "validate_dataset_in_run": "validate",
    "train_bc": "bc",
    "train_offline": "offline",
    "finetune_online": "finetune",
    "continue_with_ewc": "ewc",
    "earlier_versions": "ewc",
    "measure_candidate": "ewc",
    "evaluate_policy": "evaluate",
    "register_policy": "register",
    "promote_policy": "promote",
}
FLOW_RUN_TAG = "arl.prefect.flow_run_id"
FAILED_STAGE, DIVERGED_STAGE, ERROR = "arl.failed_stage", "arl.diverged_stage", "arl.error"

log = logging.getLogger(__name__)


def pipeline_run(flow_run_id: Any, tracking_uri: str) -> Any:
    """The parent MLflow run of Prefect flow run ``flow_run_id`` (None if it has none yet)."""
    from tasks.tracking import client

    c = client(tracking_uri)
    experiments = [e.experiment_id for e in c.search_experiments()]
    runs = c.search_runs(experiments, filter_string=f"tags.`{FLOW_RUN_TAG}` = '{flow_run_id}'")
    parents = [r for r in runs if "arl.stage" not in r.data.tags]
    return parents[0] if parents else None


def _exception(state: Any) -> BaseException | None:
    try:
        exc = state.result(raise_on_failure=False)
    except Exception:  # a result that cannot be read back names no exception type
        return None
    return exc if isinstance(exc, BaseException) else None


def tag_failed_stage(task: Any, task_run: Any, state: Any) -> None:
    """Task hook: tag the pipeline's run with the stage of ``task`` and the error."""
    from arl_models.train import TrainingDiverged
    from tasks.settings import state_paths
    from tasks.tracking import client

    uri = state_paths().mlflow_uri
    run = pipeline_run(task_run.flow_run_id, uri)
    if run is None:
        return
    stage = STAGE_OF_TASK.get(task.name, task.name)
    diverged = isinstance(_exception(state), TrainingDiverged)
    if not diverged and FAILED_STAGE in run.data.tags:
        return
    c = client(uri)
    c.set_tag(run.info.run_id, DIVERGED_STAGE if diverged else FAILED_STAGE, stage)
    c.set_tag(run.info.run_id, ERROR, (state.message or "")[:5000])


def end_failed_pipeline_run(flow: Any, flow_run: Any, state: Any) -> None:
    """Flow hook (failed or crashed): end the pipeline's run ``FAILED``, naming the stage that failed."""
    from tasks.settings import state_paths
    from tasks.tracking import client

    uri = state_paths().mlflow_uri
    run = pipeline_run(flow_run.id, uri)
    if run is None or run.info.status != "RUNNING":
        return
    tags = run.data.tags
    c = client(uri)
    stage = tags.get(FAILED_STAGE) or tags.get(DIVERGED_STAGE) or "flow"
    if FAILED_STAGE not in tags:
        c.set_tag(run.info.run_id, FAILED_STAGE, stage)
        c.set_tag(run.info.run_id, ERROR, (state.message or "")[:5000])
    c.set_terminated(run.info.run_id, status="FAILED")
    log.error("pipeline failed in stage %s: %s", stage, tags.get(ERROR) or state.message)
