"""MLflow tracking with explicit run ids: a buffered metric sink, parent and stage runs, datasets, curves.

MLflow's active run is thread-local, and a Prefect task in a thread pool does not see the flow's run, so
nothing here uses ``mlflow.start_run()``: every call names its run id. One ``log_metric`` against SQLite
costs ~26 ms, so :class:`MlflowSink` buffers and writes with ``log_batch``. MLflow is imported lazily.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

PARENT_TAG = "mlflow.parentRunId"
MAX_BATCH_METRICS = 1000  # MLflow's limit for one log_batch call
MAX_PARAM_LENGTH = 6000


def client(tracking_uri: str | None = None) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


class MlflowSink:
    """A ``MetricSink`` that buffers ``log`` calls and writes them to one run with ``log_batch``.

    Writes every ``every`` calls, on :meth:`flush` and on leaving a ``with`` block. Non-finite values are
    sent as they are (MLflow stores NaN and infinities).
    """

    def __init__(
        self, run_id: str, *, tracking_uri: str | None = None, every: int = 50, mlflow_client: Any = None
    ):
        if every < 1:
            raise ValueError("every must be >= 1")
        self.run_id = run_id
        self.every = every
        self._client = mlflow_client or client(tracking_uri)
        self._buffer: list[Any] = []
        self._calls = 0
        self._lock = threading.Lock()

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        with self._lock:
            self._buffer += [Metric(k, float(v), now, int(step)) for k, v in metrics.items()]
            self._calls += 1
            due = self._calls % self.every == 0
        if due:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._buffer = self._buffer, []
        for i in range(0, len(pending), MAX_BATCH_METRICS):
            self._client.log_batch(self.run_id, metrics=pending[i : i + MAX_BATCH_METRICS])

    def __enter__(self) -> MlflowSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts to ``a.b`` keys; values as strings cut to MLflow's length limit."""
    out: dict[str, str] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_params(v, prefix=f"{key}."))
        else:
            out[key] = str(v)[:MAX_PARAM_LENGTH]
    return out


def log_params(run_id: str, params: Mapping[str, Any], *, tracking_uri: str | None = None) -> None:
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in flatten_params(params).items()]
    c = client(tracking_uri)
    for i in range(0, len(items), 100):  # MLflow accepts at most 100 params per batch
        c.log_batch(run_id, params=items[i : i + 100])


def experiment_id(name: str, *, artifact_location: str | None = None, tracking_uri: str | None = None) -> str:
    """The id of experiment ``name``, created (artifacts under ``artifact_location``, if given) when missing."""
    c = client(tracking_uri)
    exp = c.get_experiment_by_name(name)
    return (
        exp.experiment_id
        if exp is not None
        else c.create_experiment(name, artifact_location=artifact_location)
    )


def start_parent_run(
    experiment: str,
    run_name: str,
    *,
    tags: Mapping[str, str] | None = None,
    params: Mapping[str, Any] | None = None,
    artifact_location: str | None = None,
    tracking_uri: str | None = None,
) -> str:
    """Create the pipeline's parent run; returns its id (pass it to every stage, never rely on the active run)."""
    exp_id = experiment_id(experiment, artifact_location=artifact_location, tracking_uri=tracking_uri)
    run = client(tracking_uri).create_run(exp_id, tags=dict(tags or {}), run_name=run_name)
    if params:
        log_params(run.info.run_id, params, tracking_uri=tracking_uri)
    return run.info.run_id


def start_stage_run(
    parent_run_id: str,
    stage: str,
    *,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    tracking_uri: str | None = None,
) -> str:
    """Create a run nested under ``parent_run_id`` (same experiment), tagged with its stage name."""
    c = client(tracking_uri)
    parent = c.get_run(parent_run_id)
    run = c.create_run(
        parent.info.experiment_id,
        run_name=stage,
        tags={**dict(tags or {}), PARENT_TAG: parent_run_id, "arl.stage": stage},
    )
    if params:
        log_params(run.info.run_id, params, tracking_uri=tracking_uri)
    return run.info.run_id


def end_run(run_id: str, status: str = "FINISHED", *, tracking_uri: str | None = None) -> None:
    client(tracking_uri).set_terminated(run_id, status=status)


def log_dataset_input(
    run_id: str,
    *,
    name: str,
    md5: str,
    location: str,
    context: str = "training",
    tags: Mapping[str, str] | None = None,
    tracking_uri: str | None = None,
) -> None:
    """Record a DVC-versioned dataset as an MLflow dataset input: digest = DVC hash, source = its location."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    dataset = MetaDataset(source=resolve_dataset_source(location), name=name, digest=md5)
    input_tags = [InputTag("mlflow.data.context", context)]
    c = client(tracking_uri)
    c.log_inputs(run_id, datasets=[DatasetInput(dataset._to_mlflow_entity(), tags=input_tags)])
    c.log_batch(
        run_id, tags=_tags({"arl.dataset.md5": md5, "arl.dataset.location": location, **(tags or {})})
    )


def _tags(tags: Mapping[str, str]) -> list[Any]:
    from mlflow.entities import RunTag

    return [RunTag(k, str(v)) for k, v in tags.items()]


def read_metrics_jsonl(path: str | Path) -> dict[str, list[tuple[int, float]]]:
    """``metrics.jsonl`` (one ``{"step": s, name: value...}`` per line) as ``name -> [(step, value)]``."""
    series: dict[str, list[tuple[int, float]]] = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        step = int(row.pop("step"))
        for k, v in row.items():
            series.setdefault(k, []).append((step, float(v)))
    return series


def plot_learning_curve(
    metrics_jsonl: str | Path, png: str | Path, keys: Iterable[str] | None = None
) -> Path:
    """Plot the chosen series (default: every ``eval/`` series, else all) against step into ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = read_metrics_jsonl(metrics_jsonl)
    chosen = list(keys) if keys is not None else [k for k in series if k.startswith("eval/")] or list(series)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for k in chosen:
        steps, values = zip(*series[k], strict=True) if series.get(k) else ((), ())
        ax.plot(steps, values, label=k)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    if chosen:
        ax.legend(loc="best", fontsize=8)
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)
    return png


def log_forgetting_plot(run_id: str, report: dict[str, Any], *, tracking_uri: str | None = None) -> str:
    """Bars per data version: the chain's best earlier score, the start's and the continued policy's; logs
    ``plots/forgetting.png`` on ``run_id`` and returns its artifact path."""
    import tempfile

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    versions = list(report["scores"])
    bars = {
        "best earlier": [report["best_earlier"].get(v, np.nan) for v in versions],
        "start": [report["start_scores"][v] for v in versions],
        "after EWC": [report["scores"][v] for v in versions],
    }
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    x = np.arange(len(versions))
    for i, (label, values) in enumerate(bars.items()):
        ax.bar(x + (i - 1) * 0.27, values, width=0.27, label=label)
    ax.set_xticks(x, versions, fontsize=8)
    ax.set_ylabel("score")
    ax.set_title(f"mean forgetting {report['mean_forgetting']:.2f} on the earlier versions", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    with tempfile.TemporaryDirectory() as tmp:
        png = Path(tmp) / "forgetting.png"
        fig.savefig(png)
        plt.close(fig)
        client(tracking_uri).log_artifact(run_id, str(png), artifact_path="plots")
    return "plots/forgetting.png"


def log_learning_curve(
    run_id: str,
    metrics_jsonl: str | Path,
    *,
    keys: Iterable[str] | None = None,
    name: str = "learning_curve.png",
    tracking_uri: str | None = None,
) -> str:
    """Plot ``metrics_jsonl`` and log the PNG as an artifact of ``run_id``; returns the artifact path."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        png = plot_learning_curve(metrics_jsonl, Path(tmp) / name, keys)
        client(tracking_uri).log_artifact(run_id, str(png), artifact_path="plots")
    return f"plots/{name}"
