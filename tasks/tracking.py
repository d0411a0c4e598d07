"""MLflow tracking with explicit run ids: a buffered metric sink, parent and stage runs, datasets, curves.

MLflow's active run is thread-local, and a Prefect task in a thread pool does not see the flow's run, so
nothing here uses ``mlflow.start_run()``: every call names its run id. One ``log_metric`` against SQLite
costs ~26 ms, so :class:`MlflowSink` buffers and writes with ``log_batch``. MLflow is imported lazily.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

PARENT_TAG = "mlflow.parentRunId"
MAX_BATCH_METRICS = 1000  # MLflow's limit for one log_batch call
MAX_PARAM_LENGTH = 6000
EXPERIMENT_KIND_TAG, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
"""The experiment tag where MLflow 3 keeps an experiment's kind, and the value of its "Machine learning"
(model training) kind: a UI that chooses its view per experiment opens it on its runs, not on its GenAI
traces."""
UI_WORKFLOW = "workflowType=machine_learning"
"""The query that opens MLflow 3.17's UI in its model-training view: that UI takes the view from a switch
kept in the browser (GenAI until the user flips it), not from the experiment's tag."""
PROGRESS_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
_TWICE_LOCAL = re.escape(
    "The specified dataset source can be interpreted in multiple ways: "
    "LocalArtifactDatasetSource, LocalArtifactDatasetSource."
)


def client(tracking_uri: str | None = None) -> Any:
    from mlflow import MlflowClient

    quiet_artifact_progress()
    return MlflowClient(tracking_uri=tracking_uri)


def quiet_artifact_progress() -> None:
    """No tqdm bar per artifact copy: MLflow draws one for every download, a pyfunc saved with artifacts
    included, and in a log it is a run of raw carriage returns. A value the user set is kept."""
    os.environ.setdefault(PROGRESS_BAR_ENV, "false")


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
    """The id of experiment ``name``, created (artifacts under ``artifact_location``, if given) when missing.

    It is tagged as a model-training experiment (:data:`EXPERIMENT_KIND_TAG`), an existing one too unless it
    already names a kind, so that MLflow's UI opens it on its runs rather than its GenAI traces."""
    c = client(tracking_uri)
    exp = c.get_experiment_by_name(name)
    if exp is None:
        tags = {EXPERIMENT_KIND_TAG: MODEL_TRAINING}
        return str(c.create_experiment(name, artifact_location=artifact_location, tags=tags))
    if EXPERIMENT_KIND_TAG not in exp.tags:
        c.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING)
    return str(exp.experiment_id)


def ui_url(tracking_uri: str, experiment: str, run_id: str | None = None) -> str | None:
    """The MLflow UI page of ``experiment`` (an id), or of one of its runs, in the model-training view;
    None when ``tracking_uri`` is not a server (a SQLite file has no UI of its own)."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    page = f"experiments/{experiment}/runs" + (f"/{run_id}" if run_id else "")
    return f"{tracking_uri.rstrip('/')}/#/{page}?{UI_WORKFLOW}"


def start_parent_run(
    experiment: str,
    run_name: str,
    *,
    tags: Mapping[str, str] | None = None,
    params: Mapping[str, Any] | None = None,
    artifact_location: str | None = None,
    tracking_uri: str | None = None,
) -> str:
    """Create the pipeline's parent run; returns its id (pass it to every stage, never rely on the active
    run)."""
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

    # MLflow registers its local-file source twice (for "" and "file://") and then warns that a local path
    # "can be interpreted in multiple ways: LocalArtifactDatasetSource, LocalArtifactDatasetSource"
    warnings.filterwarnings("ignore", message=_TWICE_LOCAL, category=UserWarning)
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


PANELS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("losses", lambda n: n.startswith("loss")),
    ("Q values", lambda n: n.startswith("q_")),
    ("cost Q values", lambda n: n.startswith("qc_")),
    ("normalised score", lambda n: n == "normalized_score"),
    ("return", lambda n: n in ("return", "episode_return")),
    ("cost per episode", lambda n: n in ("cost", "episode_cost")),
    ("cumulative cost", lambda n: n == "cumulative_cost"),
    ("Lagrange multiplier", lambda n: "lagrange" in n),
    ("violating episodes", lambda n: n == "violating_episodes"),
    ("share of evaluation episodes over budget", lambda n: n.endswith("over_budget_share")),
)
"""The panel of a series, by its name without the ``train/``, ``online/`` or ``eval/`` prefix: the first
that matches; a series none matches gets a panel of its own. One quantity per panel, each on its own scale."""
COST_PANEL, SHARE_PANEL = "cost per episode", "share of evaluation episodes over budget"
"""The panel that draws the episode cost budget, and the one whose axis runs from 0 to 1."""


def group_panels(keys: Iterable[str]) -> dict[str, list[str]]:
    """``keys`` by panel title (:data:`PANELS`), the panels in that table's order, then one per other key."""
    panels: dict[str, list[str]] = {}
    for key in keys:
        name = key.rsplit("/", 1)[-1]
        panels.setdefault(next((t for t, match in PANELS if match(name)), key), []).append(key)
    order = [t for t, _ in PANELS]
    return dict(sorted(panels.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))


def cost_budget(metrics_jsonl: str | Path) -> float | None:
    """The episode cost budget a stage trained under: ``env.cost_budget`` in the ``config.json`` beside its
    ``metrics.jsonl`` (the task's, or the one the run was given); None without one."""
    config = Path(metrics_jsonl).with_name("config.json")
    if not config.is_file():
        return None
    budget = json.loads(config.read_text()).get("env", {}).get("cost_budget")
    return float(budget) if isinstance(budget, int | float) and not isinstance(budget, bool) else None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(plt: Any, n: int) -> tuple[Any, list[Any]]:
    """A figure of ``n`` panels, at most three a row, and its axes in reading order (spares hidden)."""
    cols = min(max(n, 1), 3)
    rows = -(-max(n, 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.7 * rows), dpi=100, squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat


def _save(plt: Any, fig: Any, png: str | Path) -> Path:
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return png


def _draw_panel(
    ax: Any, title: str, curves: dict[str, list[tuple[int, float]]], budget: float | None
) -> None:
    values: list[float] = []
    for key, points in curves.items():
        steps, ys = zip(*points, strict=True)
        ax.plot(steps, ys, marker="o" if len(steps) < 15 else None, ms=3, lw=1.2, label=key)
        values += [y for y in ys if math.isfinite(y)]
    if title == COST_PANEL and budget is not None:
        ax.axhline(budget, color="crimson", ls="--", lw=1, label=f"budget {budget:g}")
    if title == "losses" and values:
        # losses of one stage span orders of magnitude: on a linear axis the largest flattens the rest
        ax.set_yscale("log" if min(values) > 0 else "symlog")
    if title == SHARE_PANEL:
        ax.set_ylim(-0.02, 1.02)
    elif title in (COST_PANEL, "cumulative cost") and values and min(values) >= 0:
        ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(which="both", labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=7)


def plot_learning_curve(
    metrics_jsonl: str | Path,
    png: str | Path,
    keys: Iterable[str] | None = None,
    *,
    budget: float | None = None,
) -> Path:
    """Small multiples of the chosen series (default: every ``eval/`` series, else all) against step, one
    panel per quantity (:data:`PANELS`), into ``png``. The cost-per-episode panel draws the episode budget
    (``budget``, else :func:`cost_budget`) as a dashed line."""
    plt = _pyplot()
    series = read_metrics_jsonl(metrics_jsonl)
    chosen = list(keys) if keys is not None else [k for k in series if k.startswith("eval/")] or list(series)
    panels = group_panels(k for k in chosen if series.get(k))
    if budget is None:
        budget = cost_budget(metrics_jsonl)
    fig, axes = _grid(plt, len(panels))
    for ax, (title, members) in zip(axes, panels.items(), strict=False):
        _draw_panel(ax, title, {k: series[k] for k in members}, budget)
    return _save(plt, fig, png)


def plot_forgetting(report: Mapping[str, Any], png: str | Path, *, bound: float | None = None) -> Path:
    """Two panels: the score on each data version (the chain's best earlier score, the start's and the
    continued policy's), and the forgetting on each earlier version (best earlier minus after) with
    ``bound``, the gate's limit, where given."""
    import numpy as np

    plt = _pyplot()
    versions = list(report["scores"])
    forgetting = dict(report.get("forgetting") or {})
    fig, axes = _grid(plt, 2 if forgetting else 1)
    x = np.arange(len(versions))
    points = {
        "best earlier": [report["best_earlier"].get(v, np.nan) for v in versions],
        "start": [report["start_scores"][v] for v in versions],
        "after EWC": [report["scores"][v] for v in versions],
    }
    for i, (label, values) in enumerate(points.items()):
        axes[0].plot(x + (i - 1) * 0.12, values, marker="os^"[i], ls="none", label=label)
    axes[0].set_xticks(x, versions, fontsize=7)
    axes[0].set_title("score per data version", fontsize=9)
    axes[0].set_ylabel("normalised score", fontsize=8)
    if forgetting:
        earlier = list(forgetting)
        lost = [forgetting[v] for v in earlier]
        over = [bound is not None and f > bound for f in lost]
        axes[1].bar(earlier, lost, color=["crimson" if o else "tab:blue" for o in over], width=0.5)
        axes[1].axhline(0, color="black", lw=0.8)
        axes[1].set_xlim(-1, len(earlier))
        axes[1].set_ylabel("score lost", fontsize=8)
        if bound is not None:
            axes[1].axhline(bound, color="crimson", ls="--", lw=1, label=f"bound {bound:g}")
            axes[1].legend(loc="best", fontsize=7)
        axes[1].set_title(f"forgetting (mean {report['mean_forgetting']:.2f})", fontsize=9)
        axes[1].tick_params(axis="x", labelsize=7)
    axes[0].legend(loc="best", fontsize=7)
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="y", labelsize=7)
    return _save(plt, fig, png)


def log_forgetting_plot(
    run_id: str,
    report: dict[str, Any],
    *,
    bound: float | None = None,
    tracking_uri: str | None = None,
) -> str:
    """:func:`plot_forgetting` logged as ``plots/forgetting.png`` on ``run_id``; returns its artifact path."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        png = plot_forgetting(report, Path(tmp) / "forgetting.png", bound=bound)
        client(tracking_uri).log_artifact(run_id, str(png), artifact_path="plots")
    return "plots/forgetting.png"


def log_learning_curve(
    run_id: str,
    metrics_jsonl: str | Path,
    *,
    keys: Iterable[str] | None = None,
    name: str = "learning_curve.png",
    budget: float | None = None,
    tracking_uri: str | None = None,
) -> str:
    """Plot ``metrics_jsonl`` (:func:`plot_learning_curve`) and log the PNG as an artifact of ``run_id``;
    returns the artifact path."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        png = plot_learning_curve(metrics_jsonl, Path(tmp) / name, keys, budget=budget)
        client(tracking_uri).log_artifact(run_id, str(png), artifact_path="plots")
    return f"plots/{name}"
