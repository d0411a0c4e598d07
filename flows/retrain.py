"""``retrain_on_new_data_flow``: what the ``arl.dataset.pushed`` trigger starts, for exactly that version.

It records which earlier data version the current champion was trained on, then runs the pipeline on the
new version. Stages a finished run already produced for the same data and config are reused, not redone.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from flows.offline_to_online import offline_to_online_flow
from flows.params import DEFAULT_GATE, DEFAULT_TRAINING, DatasetRef, GateConfig, TrainingConfig
from tasks.data import flow_data_repo, pull_dataset_task
from tasks.settings import state_paths


def _champion_dataset(model_name: str, uri: str) -> str | None:
    from tasks import registry, tracking

    version = registry.alias_version(model_name, registry.CHAMPION, tracking_uri=uri)
    if version is None:
        return None
    return tracking.client(uri).get_model_version(model_name, version).tags.get("arl.dataset_hash")


@flow(name="retrain-on-new-data", log_prints=True)
def retrain_on_new_data_flow(
    dataset: DatasetRef,
    training: TrainingConfig = DEFAULT_TRAINING,
    gate: GateConfig = DEFAULT_GATE,
    experiment: str | None = None,
) -> dict[str, Any]:
    """Retrain on ``dataset`` (its ``version`` is the hash the event carried)."""
    logger = get_run_logger()
    paths = state_paths()
    if not dataset.version:
        logger.warning("no version given: training on the latest committed version of %s", dataset.path)
    data = pull_dataset_task(
        str(flow_data_repo(dataset.repo, paths.data_repo)), dataset.path, dataset.version
    )
    model_name = gate.model_name or f"arl-{data['task']}"
    earlier = _champion_dataset(model_name, paths.mlflow_uri)
    logger.info(
        "new data %s at %s; the champion of %s was trained on %s",
        dataset.path,
        data["md5"],
        model_name,
        earlier or "nothing yet",
    )
    # ---- EWC continual learning (arl_models.continual) takes the earlier versions from here once
    #      delivered: pass the champion's dataset hash to the pipeline's stage 4.
    return offline_to_online_flow(
        dataset=dataset.model_copy(update={"version": data["md5"]}),
        training=training,
        gate=gate,
        experiment=experiment,
    )
