"""The pipeline's parent MLflow run: open it (with the dataset as input), validate under it, close it.

One parent run per pipeline run, one nested run per stage. Ids are passed explicitly, never taken from
MLflow's thread-local active run.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from tasks import tracking
from tasks.validate import DataValidationError, validate_dataset


@task(name="start_pipeline_run", retries=2, retry_delay_seconds=5)
def start_pipeline_run(
    experiment: str,
    run_name: str,
    dataset: dict[str, Any],
    params: dict[str, Any],
    tags: dict[str, str],
    tracking_uri: str,
    artifact_location: str | None = None,
) -> str:
    """Create the parent run, log the flow's parameters and the dataset (DVC hash and location) as its
    input."""
    run_id = tracking.start_parent_run(
        experiment,
        run_name,
        tags=tags,
        params=params,
        artifact_location=artifact_location,
        tracking_uri=tracking_uri,
    )
    tracking.log_dataset_input(
        run_id,
        name=dataset["path"],
        md5=dataset["md5"],
        location=dataset["location"],
        tags={
            "arl.dataset.git_rev": dataset["git_rev"],
            "arl.dataset.remote": dataset["remote"],
            "arl.env_version": dataset["env_version"],
            "arl.behaviour_policy_hash": dataset["policy_hash"],
        },
        tracking_uri=tracking_uri,
    )
    page = None
    if tracking_uri.startswith(("http://", "https://")):
        exp_id = tracking.client(tracking_uri).get_run(run_id).info.experiment_id
        page = tracking.ui_url(tracking_uri, exp_id, run_id)
    get_run_logger().info("MLflow run %s in experiment %s (%s)", run_id, experiment, page or tracking_uri)
    return run_id


@task(name="validate_dataset_in_run", retries=0)
def validate_in_run(
    path: str, parent_run_id: str, tracking_uri: str, data_docs_dir: str | None = None
) -> dict:
    """Great Expectations before any training, as the nested ``validate`` run.

    Failing expectations (with example values and rows) go to the Prefect log, to the run's tags, and into
    the raised :class:`~tasks.validate.DataValidationError`. Bytes that already passed the same suites (at
    ingest, or in an earlier run) are not validated again: the nested ``validate_dataset`` task returns the
    recorded verdict (a ``Cached`` task run), and this run logs it with ``arl.validation.reused=true`` and
    when it was validated.
    """
    from mlflow.entities import Metric, RunTag

    run_id = tracking.start_stage_run(
        parent_run_id, "validate", params={"path": path}, tracking_uri=tracking_uri
    )
    c = tracking.client(tracking_uri)
    try:
        state = validate_dataset(path, data_docs_dir=data_docs_dir, return_state=True)
        summary = state.result()  # raises the task's DataValidationError
    except DataValidationError as e:
        failed = sorted({f.expectation for f in e.report.failures})
        c.set_tag(run_id, "arl.validation.failed", ", ".join(failed)[:5000])
        c.set_tag(run_id, "arl.validation.report", e.report.summary()[:5000])
        tracking.end_run(run_id, "FAILED", tracking_uri=tracking_uri)
        raise
    except BaseException:
        tracking.end_run(run_id, "FAILED", tracking_uri=tracking_uri)
        raise
    validated_at = summary.get("validated_at")
    reused = state.name == "Cached"
    if reused:
        get_run_logger().info(
            "%s: these bytes passed the same suites at %s (%s); not validated again",
            path,
            validated_at,
            summary["path"],
        )
    c.log_batch(
        run_id,
        metrics=[
            Metric("validate/num_rows", summary["num_rows"], 0, 0),
            Metric("validate/expectations", summary["expectations"], 0, 0),
        ],
        tags=[
            RunTag("arl.validation.reused", str(reused).lower()),
            RunTag("arl.validation.validated_at", str(validated_at)),
            RunTag("arl.validation.validated_path", summary["path"]),
        ],
    )
    tracking.end_run(run_id, tracking_uri=tracking_uri)
    return {**summary, "path": path, "reused": reused}


@task(name="finish_pipeline_run", retries=2, retry_delay_seconds=5)
def finish_pipeline_run(
    run_id: str,
    status: str,
    tracking_uri: str,
    tags: dict[str, str] | None = None,
    metrics: dict[str, float] | None = None,
) -> None:
    """Summary metrics and tags on the parent run, then its final status (``FINISHED`` | ``FAILED``)."""
    from mlflow.entities import Metric, RunTag

    c = tracking.client(tracking_uri)
    c.log_batch(
        run_id,
        metrics=[Metric(k, float(v), 0, 0) for k, v in (metrics or {}).items()],
        tags=[RunTag(k, str(v)[:5000]) for k, v in (tags or {}).items()],
    )
    tracking.end_run(run_id, status, tracking_uri=tracking_uri)


def run_summary(
    stages: list[dict[str, Any]], evaluation: dict[str, Any], forgetting: float | None
) -> dict[str, float]:
    """The parent run's metrics: the gated policy's ``score``, ``mean_cost`` and ``forgetting``; each stage's
    last evaluation (``<stage>/score``, ``/return``, ``/cost``, where the stage evaluated), EWC's score on the
    new version and its forgetting per earlier version (``ewc/forgetting/<task>-<version>``)."""
    out = {"score": float(evaluation["score"]), "mean_cost": float(evaluation["mean_cost"])}
    if forgetting is not None:
        out["forgetting"] = float(forgetting)
    for s in stages:
        m = s["metrics"]
        for key, name in (
            ("eval/normalized_score", "score"),
            ("eval/return", "return"),
            ("eval/cost", "cost"),
        ):
            if key in m:
                out[f"{s['stage']}/{name}"] = float(m[key])
        report = continual_report(s)
        if report:
            out["ewc/score"] = float(report["new_score"])
        out |= {
            f"ewc/forgetting/{v.replace('@', '-')}": float(f) for v, f in report.get("forgetting", {}).items()
        }
    return out


def continual_report(stage: dict[str, Any]) -> dict[str, Any]:
    """The EWC stage's report of scores and forgetting per version (``continual.json``), or empty."""
    import json
    from pathlib import Path

    f = Path(stage["checkpoint"]) / "continual.json"
    return json.loads(f.read_text())["ewc"] if stage["stage"] == "ewc" and f.is_file() else {}
