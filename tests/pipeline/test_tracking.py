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


def test_a_local_dataset_location_is_logged_without_a_warning(
    mlflow_uri: str, run_ids: tuple[str, str], tmp_path: Path
) -> None:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracking.log_dataset_input(
            run_ids[1],
            name="local",
            md5=uuid.uuid4().hex + ".dir",
            location=str(tmp_path),
            tracking_uri=mlflow_uri,
        )
    assert [str(w.message) for w in caught if "mlflow" in w.filename] == []


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


def test_experiments_open_as_model_training(mlflow_uri: str, run_ids: tuple[str, str]) -> None:
    """MLflow's UI shows an experiment tagged ``custom_model_development`` on its runs, not its GenAI
    traces: a created experiment carries the tag, an untagged one gets it, a chosen kind stays."""
    c = tracking.client(mlflow_uri)
    created = c.get_experiment(c.get_run(run_ids[0]).info.experiment_id)
    assert created.tags[tracking.EXPERIMENT_KIND_TAG] == tracking.MODEL_TRAINING
    untagged = c.create_experiment(f"arl-untagged-{uuid.uuid4().hex[:8]}")
    chosen = c.create_experiment(
        f"arl-chosen-{uuid.uuid4().hex[:8]}", tags={tracking.EXPERIMENT_KIND_TAG: "genai_development"}
    )
    for exp_id in (untagged, chosen):
        assert tracking.experiment_id(c.get_experiment(exp_id).name, tracking_uri=mlflow_uri) == exp_id
    assert c.get_experiment(untagged).tags[tracking.EXPERIMENT_KIND_TAG] == tracking.MODEL_TRAINING
    assert c.get_experiment(chosen).tags[tracking.EXPERIMENT_KIND_TAG] == "genai_development"


def test_ui_links_open_the_model_training_view() -> None:
    assert tracking.ui_url("sqlite:///x.db", "1") is None
    assert tracking.ui_url("http://127.0.0.1:5000/", "3", "abc") == (
        "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    )


def test_one_panel_per_quantity() -> None:
    keys = [
        "train/loss_td",
        "train/q_data",
        "train/loss_actor",
        "eval/normalized_score",
        "online/episode_cost",
        "online/cumulative_cost",
        "eval/cost",
        "online/lagrange_multiplier",
        "online/violating_episodes",
        "eval/over_budget_share",
        "train/conservative_weight",
    ]
    assert tracking.group_panels(keys) == {
        "losses": ["train/loss_td", "train/loss_actor"],
        "Q values": ["train/q_data"],
        "normalised score": ["eval/normalized_score"],
        "cost per episode": ["online/episode_cost", "eval/cost"],
        "cumulative cost": ["online/cumulative_cost"],
        "Lagrange multiplier": ["online/lagrange_multiplier"],
        "violating episodes": ["online/violating_episodes"],
        "share of evaluation episodes over budget": ["eval/over_budget_share"],
        "train/conservative_weight": ["train/conservative_weight"],
    }


def _stage_dir(tmp_path: Path, budget: float | None) -> Path:
    """A stage's ``metrics.jsonl`` (fine-tuning's cost series) and, with ``budget``, its ``config.json``."""
    rows = [
        {
            "step": s,
            "online/episode_cost": 30.0 / (s + 1),
            "online/cumulative_cost": 40.0 * s,
            "eval/cost": 9.0,
        }
        for s in range(1, 8)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if budget is not None:
        (tmp_path / "config.json").write_text(json.dumps({"env": {"cost_budget": budget}}))
    return tmp_path / "metrics.jsonl"


def test_cost_curve_draws_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget comes from the stage's ``config.json`` (or the caller) and is drawn on the cost panel only;
    the cumulative cost has a panel of its own, where it cannot flatten the per-episode cost."""
    drawn: list[tuple[str, list[str], float | None]] = []
    draw = tracking._draw_panel

    def recording(ax: object, title: str, curves: dict, budget: float | None) -> None:
        drawn.append((title, list(curves), budget))
        draw(ax, title, curves, budget)

    monkeypatch.setattr(tracking, "_draw_panel", recording)
    jsonl = _stage_dir(tmp_path, budget=10.0)
    assert tracking.cost_budget(jsonl) == 10.0
    png = tracking.plot_learning_curve(
        jsonl, tmp_path / "cost_curve.png", list(tracking.read_metrics_jsonl(jsonl))
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [(t, k) for t, k, _ in drawn] == [
        ("cost per episode", ["online/episode_cost", "eval/cost"]),
        ("cumulative cost", ["online/cumulative_cost"]),
    ]
    assert {b for _, _, b in drawn} == {10.0}
    drawn.clear()
    tracking.plot_learning_curve(jsonl, tmp_path / "given.png", ["online/episode_cost"], budget=4.0)
    assert drawn == [("cost per episode", ["online/episode_cost"], 4.0)]
    drawn.clear()
    bare = tmp_path / "bare"
    bare.mkdir()
    tracking.plot_learning_curve(_stage_dir(bare, budget=None), bare / "c.png", ["eval/cost"])
    assert drawn == [("cost per episode", ["eval/cost"], None)]


def test_forgetting_plot(mlflow_uri: str, run_ids: tuple[str, str], tmp_path: Path) -> None:
    report = {
        "scores": {"t@1.0.0": 80.0, "t@1.1.0": 85.0, "t@1.2.0": 90.0},
        "start_scores": {"t@1.0.0": 84.0, "t@1.1.0": 86.0, "t@1.2.0": 70.0},
        "best_earlier": {"t@1.0.0": 84.0, "t@1.1.0": 86.0},
        "forgetting": {"t@1.0.0": 4.0, "t@1.1.0": 1.0},
        "mean_forgetting": 2.5,
    }
    artifact = tracking.log_forgetting_plot(run_ids[0], report, bound=3.0, tracking_uri=mlflow_uri)
    local = tracking.client(mlflow_uri).download_artifacts(run_ids[0], artifact, str(tmp_path / "dl"))
    assert artifact == "plots/forgetting.png" and Path(local).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = {**report, "best_earlier": {}, "forgetting": {}, "mean_forgetting": 0.0}
    assert tracking.plot_forgetting(first, tmp_path / "first.png").is_file()  # no earlier version: one panel
