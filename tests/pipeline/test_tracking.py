"""MLflow tracking on a temporary SQLite store: buffered sink, nested runs, dataset inputs, curves."""

from __future__ import annotations

import json
import math
import threading
import uuid
from pathlib import Path

import pytest

from arl_models.metrics import MetricSink
from tasks import tracking

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def run_ids(mlflow_uri: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    artifacts = tmp_path_factory.mktemp("artifacts")
    parent = tracking.start_parent_run(
        "arl-tests-tracking",
        "pipeline",
        tags={"arl.task": "safe-pendulum"},
        params={"bc": {"lr": 3e-4}},
        artifact_location=artifacts.as_uri(),
        tracking_uri=mlflow_uri,
    )
    stage = tracking.start_stage_run(parent, "cql", params={"alpha": 5.0}, tracking_uri=mlflow_uri)
    return parent, stage


def test_sink_buffers_and_writes_in_batches(mlflow_uri: str, run_ids: tuple[str, str]) -> None:
    calls: list[int] = []
    real = tracking.client(mlflow_uri)

    class Counting:
        def log_batch(self, run_id: str, metrics: list) -> None:
            calls.append(len(metrics))
            real.log_batch(run_id, metrics=metrics)

    sink = tracking.MlflowSink(run_ids[1], every=10, mlflow_client=Counting())
    assert isinstance(sink, MetricSink)
    with sink:
        for step in range(25):
            sink.log({"train/loss_critic": 1.0 / (step + 1), "train/alpha": 0.5}, step)
        assert calls == [20, 20]  # two writes so far, the rest still buffered
    assert calls == [20, 20, 10]
    history = real.get_metric_history(run_ids[1], "train/loss_critic")
    assert [m.step for m in history] == list(range(25)) and math.isclose(history[-1].value, 1 / 25)


def test_sink_is_safe_across_threads(mlflow_uri: str, run_ids: tuple[str, str]) -> None:
    sink = tracking.MlflowSink(run_ids[1], tracking_uri=mlflow_uri, every=7)
    threads = [
        threading.Thread(target=lambda k=k: [sink.log({f"t/{k}": i}, i) for i in range(20)]) for k in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sink.flush()
    c = tracking.client(mlflow_uri)
    assert all(len(c.get_metric_history(run_ids[1], f"t/{k}")) == 20 for k in range(3))


def test_stage_run_is_nested_with_params(mlflow_uri: str, run_ids: tuple[str, str]) -> None:
    parent, stage = run_ids
    run = tracking.client(mlflow_uri).get_run(stage)
    assert run.data.tags[tracking.PARENT_TAG] == parent and run.data.tags["arl.stage"] == "cql"
    assert run.data.params == {"alpha": "5.0"}
    assert tracking.client(mlflow_uri).get_run(parent).data.params == {"bc.lr": "0.0003"}


def test_dataset_input_carries_dvc_hash(mlflow_uri: str, run_ids: tuple[str, str]) -> None:
    md5 = uuid.uuid4().hex + ".dir"
    tracking.log_dataset_input(
        run_ids[1],
        name="safe-pendulum-medium",
        md5=md5,
        location="s3://arl-data/dvc/files/md5",
        tracking_uri=mlflow_uri,
    )
    run = tracking.client(mlflow_uri).get_run(run_ids[1])
    (inp,) = [d for d in run.inputs.dataset_inputs if d.dataset.digest == md5]
    assert inp.dataset.name == "safe-pendulum-medium" and "arl-data" in inp.dataset.source
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == "training"
    assert run.data.tags["arl.dataset.md5"] == md5


def test_learning_curve_png(mlflow_uri: str, run_ids: tuple[str, str], tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    jsonl.write_text(
        "".join(
            json.dumps({"step": s, "eval/return": -1000 + 10 * s, "train/loss": 1 / (s + 1)}) + "\n"
            for s in range(0, 100, 10)
        )
    )
    assert set(tracking.read_metrics_jsonl(jsonl)) == {"eval/return", "train/loss"}
    artifact = tracking.log_learning_curve(run_ids[0], jsonl, tracking_uri=mlflow_uri)
    local = tracking.client(mlflow_uri).download_artifacts(run_ids[0], artifact, str(tmp_path / "dl"))
    assert Path(local).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_end_run(mlflow_uri: str, run_ids: tuple[str, str]) -> None:
    tracking.end_run(run_ids[1], tracking_uri=mlflow_uri)
    assert tracking.client(mlflow_uri).get_run(run_ids[1]).info.status == "FINISHED"
