"""Training stages as Prefect tasks: one verb per stage (:func:`train_bc`, :func:`train_offline`,
:func:`finetune_online`, :func:`continue_with_ewc`), each taking its :class:`~tasks.stages.StageSpec` and
logging to a nested MLflow run.

A stage is a pure function of (dataset hash, spec, upstream stage), so its
result is cached under that key (:func:`stage_key`): a pipeline run that failed after stage 2 and is run
again does not retrain stages 1 and 2. The checkpoint directory is content-addressed by the same key
(``runs/<dataset>/<stage>-<key>/``), so a stage interrupted mid-way resumes from its ``train_state/``, and
a finished checkpoint found on disk is reused even when Prefect's result cache is gone.

The MLflow run id is always passed in (the active run is thread-local); metrics go through a buffered
:class:`~tasks.tracking.MlflowSink`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from tasks import tracking
from tasks.stages import StageSpec

COMPLETION_KEY = {"ewc": "continual/ewc_mean_forgetting"}
"""A metric a stage writes only once it has finished everything (EWC: after measuring forgetting)."""
CURVES = {
    "learning_curve.png": lambda k: (
        k.startswith(("train/loss_", "online/loss_"))
        or k in ("eval/normalized_score", "train/q_data", "online/q_data")
    ),
    "cost_curve.png": lambda k: any(
        w in k for w in ("cost", "lagrange", "over_budget", "violat", "conservative")
    ),
}
PROGRESS_LINES = 10
"""Progress lines a stage logs (one per tenth of its steps): the worker's log shows no progress bars."""


def stage_key(spec: StageSpec, dataset_md5: str, upstream_key: str | None, inputs: Any = None) -> str:
    """sha256 of everything that determines a stage's output: the spec, the data, the upstream stage,
    other inputs (EWC: the earlier versions' datasets) and the networks' layout."""
    from arl_models import nets

    blob = json.dumps(
        {
            "spec": spec.identity(),
            "dataset": dataset_md5,
            "upstream": upstream_key,
            "inputs": inputs,
            "layout": nets.layout_signature(),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _cache_key(context: Any, parameters: dict[str, Any]) -> str:
    upstream = parameters.get("init_from") or {}
    spec, md5 = parameters["spec"], parameters["dataset"]["md5"]
    return "arl-stage-" + stage_key(spec, md5, upstream.get("key"), parameters.get("previous"))


def checkpoint_dir(runs_dir: str | Path, dataset_md5: str, stage: str, key: str) -> Path:
    return Path(runs_dir) / dataset_md5.removesuffix(".dir")[:12] / f"{stage}-{key[:12]}"


def _finished(out: Path, stage: str, steps: int) -> dict[str, float] | None:
    """The final metrics of a checkpoint that completed ``steps`` (and, for EWC, measured forgetting)."""
    from arl_models.checkpoint import finished

    metrics = finished(out, steps)
    return metrics if metrics is not None and COMPLETION_KEY.get(stage, "wall_time_s") in metrics else None


def _log_curves(run_id: str, out: Path, tracking_uri: str) -> list[str]:
    jsonl = out / "metrics.jsonl"
    if not jsonl.is_file():
        return []
    keys = list(tracking.read_metrics_jsonl(jsonl))
    logged = []
    for name, wanted in CURVES.items():
        chosen = [k for k in keys if wanted(k)]
        if chosen:
            logged.append(
                tracking.log_learning_curve(run_id, jsonl, keys=chosen, name=name, tracking_uri=tracking_uri)
            )
    return logged


class _ProgressLog:
    """Forwards a stage's metrics to ``sink`` and logs a line at each tenth of its steps with an estimate
    of the time left."""

    def __init__(self, sink: Any, stage: str, steps: int, logger: Any):
        self.sink, self.stage, self.steps, self.logger = sink, stage, max(1, steps), logger
        self.start, self.next = time.monotonic(), self.steps / PROGRESS_LINES

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.sink.log(metrics, step)
        if self.next <= step < self.steps:
            elapsed = time.monotonic() - self.start
            self.logger.info(
                "%s: %d/%d steps (%d%%), %.0f s, about %.0f s left",
                self.stage,
                step,
                self.steps,
                100 * step // self.steps,
                elapsed,
                elapsed * (self.steps - step) / step,
            )
            self.next = (step * PROGRESS_LINES // self.steps + 1) * self.steps / PROGRESS_LINES


def _algo_params(config: Any) -> dict[str, Any]:
    """The library config as run params; the conditioning follows the dataset's task
    (``arl_models.offline.conditioning``), and the run's ``arl.context_dim`` tag has its value."""
    fields = dataclasses.asdict(config)
    return fields | ({"context_dim": "task"} if "context_dim" in fields else {})


Train = Callable[[Path, Any, bool], dict[str, float]]
"""A stage's library call: ``(checkpoint dir, metric sink, progress bars) -> final metrics``."""


def _run_stage(
    spec: StageSpec,
    dataset: dict[str, Any],
    parent_run_id: str,
    tracking_uri: str,
    runs_dir: str,
    init_from: dict[str, Any] | None,
    train: Train,
    inputs: Any = None,
) -> dict[str, Any]:
    """Everything around a stage's library call: its checkpoint directory (by key), its nested MLflow run,
    reuse of a finished checkpoint, threads, progress lines, curves; returns the stage's result."""
    logger = get_run_logger()
    key = stage_key(spec, dataset["md5"], (init_from or {}).get("key"), inputs)
    out = checkpoint_dir(runs_dir, dataset["md5"], spec.stage, key)
    params = {
        **{k: v for k, v in dataclasses.asdict(spec).items() if k != "config"},
        **{f"algo.{k}": v for k, v in _algo_params(spec.config).items()},
        "stage_key": key,
        "checkpoint": str(out),
        "init_from": (init_from or {}).get("checkpoint", ""),
    }
    run_id = tracking.start_stage_run(
        parent_run_id, spec.stage, params=params, tags={"arl.stage_key": key}, tracking_uri=tracking_uri
    )
    try:
        final = _finished(out, spec.stage, spec.steps)
        if final is not None:
            logger.info("%s: reusing the finished checkpoint %s", spec.stage, out)
            tracking.client(tracking_uri).set_tag(run_id, "arl.reused_checkpoint", "true")
        else:
            from arl_models.presets import apply_threads

            threads = apply_threads(spec.preset, spec.threads)
            logger.info(
                "%s (%s): training %d steps into %s, %d torch thread%s",
                spec.stage,
                spec.algo,
                spec.steps,
                out,
                threads,
                "s"[: threads > 1],
            )
            with tracking.MlflowSink(run_id, tracking_uri=tracking_uri, every=10) as sink:
                final = train(out, _ProgressLog(sink, spec.stage, spec.steps, logger), sys.stderr.isatty())
        _log_curves(run_id, out, tracking_uri)
        c = tracking.client(tracking_uri)
        from arl_models.checkpoint import read_config

        record = read_config(out)
        c.set_tag(run_id, "arl.context_dim", str(record["config"].get("context_dim", 0)))
        c.set_tag(run_id, "arl.algo", record["algo"])
        c.log_artifact(run_id, str(out / "config.json"), artifact_path="checkpoint")
        c.log_artifact(run_id, str(out / "metrics.json"), artifact_path="checkpoint")
    except BaseException:
        tracking.end_run(run_id, "FAILED", tracking_uri=tracking_uri)
        raise
    tracking.end_run(run_id, tracking_uri=tracking_uri)
    shown = ("eval/", "train/loss", "online/cumul")
    logger.info("%s done: %s", spec.stage, {k: round(v, 3) for k, v in final.items() if k.startswith(shown)})
    here = {"path": dataset["path"], "md5": dataset["md5"]}
    return {
        "stage": spec.stage,
        "key": key,
        "chain": [*(init_from or {}).get("chain", []), here] if spec.stage == "ewc" else [here],
        "checkpoint": str(out),
        "metrics": final,
        "run_id": run_id,
        "parent_run_id": parent_run_id,
        "steps": spec.steps,
        "online_steps": getattr(spec.config, "online_steps", 0),  # stage 4 fine-tunes after its offline steps
        "seed": spec.seed,
    }


STAGE_TASK: dict[str, Any] = {
    "cache_key_fn": _cache_key,
    "persist_result": True,
    "result_serializer": "json",  # a cache hit reads JSON back: a persisted result is never unpickled
    "retries": 0,  # training is not I/O: a retry would repeat the failure; a killed process resumes instead
}


@task(name="train_bc", task_run_name="train bc", **STAGE_TASK)
def train_bc(
    spec: StageSpec, dataset: dict[str, Any], parent_run_id: str, tracking_uri: str, runs_dir: str
) -> dict[str, Any]:
    """Stage 1: behaviour cloning on the pulled dataset (``arl_models.offline.train_bc``)."""
    from arl_models.offline import train_bc as fit_bc

    def train(out: Path, sink: Any, progress: bool) -> dict[str, float]:
        return fit_bc(
            dataset["dir"],
            out,
            preset=spec.preset,
            seed=spec.seed,
            steps=spec.steps,
            config=spec.config,
            sink=sink,
            progress=progress,
            eval_episodes=spec.eval_episodes,
        )

    return _run_stage(spec, dataset, parent_run_id, tracking_uri, runs_dir, None, train)


@task(name="train_offline", task_run_name="train offline", **STAGE_TASK)
def train_offline(
    spec: StageSpec,
    dataset: dict[str, Any],
    parent_run_id: str,
    tracking_uri: str,
    runs_dir: str,
    init_from: dict[str, Any],
) -> dict[str, Any]:
    """Stage 2: offline RL (``spec.algo``) with its cost critic, from stage 1's actor
    (``arl_models.offline.train_offline_algo``)."""
    from arl_models.offline import train_offline_algo

    def train(out: Path, sink: Any, progress: bool) -> dict[str, float]:
        return train_offline_algo(
            spec.algo,
            dataset["dir"],
            out,
            preset=spec.preset,
            seed=spec.seed,
            steps=spec.steps,
            init_actor=init_from["checkpoint"],
            constrained=spec.constrained,
            config=spec.config,
            sink=sink,
            progress=progress,
            eval_episodes=spec.eval_episodes,
        )

    return _run_stage(spec, dataset, parent_run_id, tracking_uri, runs_dir, init_from, train)


@task(name="finetune_online", task_run_name="train finetune", **STAGE_TASK)
def finetune_online(
    spec: StageSpec,
    dataset: dict[str, Any],
    parent_run_id: str,
    tracking_uri: str,
    runs_dir: str,
    init_from: dict[str, Any],
) -> dict[str, Any]:
    """Stage 3: constrained online fine-tuning from stage 2's policy, the dataset mixed in
    (``arl_models.online.finetune``)."""
    from arl_models.online import finetune

    def train(out: Path, sink: Any, progress: bool) -> dict[str, float]:
        return finetune(
            init_from["checkpoint"],
            out,
            data=dataset["dir"],
            config=spec.config,
            sink=sink,
            progress=progress,
        )

    return _run_stage(spec, dataset, parent_run_id, tracking_uri, runs_dir, init_from, train)


@task(name="continue_with_ewc", task_run_name="train ewc", **STAGE_TASK)
def continue_with_ewc(
    spec: StageSpec,
    dataset: dict[str, Any],
    parent_run_id: str,
    tracking_uri: str,
    runs_dir: str,
    init_from: dict[str, Any],
    previous: list[str],
) -> dict[str, Any]:
    """Stage 4: the champion (``init_from``) continued on the new data under an EWC penalty over the
    earlier versions' datasets (``previous``, oldest first), then fine-tuned online under the same penalty;
    forgetting measured on each (``arl_models.continual.train_continual``)."""
    from arl_models.continual import train_continual

    def train(out: Path, sink: Any, progress: bool) -> dict[str, float]:
        train_continual(
            init_from["checkpoint"],
            dataset["dir"],
            out,
            previous=previous,
            config=spec.config,
            sink=sink,
            progress=progress,
        )
        return json.loads((out / "metrics.json").read_text())

    return _run_stage(spec, dataset, parent_run_id, tracking_uri, runs_dir, init_from, train, inputs=previous)


STAGE_VERBS = {
    "bc": train_bc,
    "offline": train_offline,
    "finetune": finetune_online,
    "ewc": continue_with_ewc,
}


def run_stage(
    verb: Any,
    spec: StageSpec,
    dataset: dict[str, Any],
    parent_run_id: str,
    tracking_uri: str,
    runs_dir: str,
    *,
    refresh: bool = False,
    **inputs: Any,
) -> dict[str, Any]:
    """Run a stage verb (``inputs``: its ``init_from``, ``previous``), cached across pipeline runs; a cache
    hit gets its own nested run linking the original, and is retrained when it outlived its checkpoint."""
    args = (spec, dataset, parent_run_id, tracking_uri, runs_dir)
    result = verb.with_options(refresh_cache=refresh or None)(*args, **inputs)
    if result["parent_run_id"] == parent_run_id:
        return result
    if not (Path(result["checkpoint"]) / "config.json").is_file():
        return verb.with_options(refresh_cache=True)(*args, **inputs)
    return record_reused_stage(result, parent_run_id, tracking_uri)


@task(name="record_reused_stage", retries=2, retry_delay_seconds=2, task_run_name="reuse {result[stage]}")
def record_reused_stage(result: dict[str, Any], parent_run_id: str, tracking_uri: str) -> dict[str, Any]:
    """A cached stage still gets its nested run in this pipeline run: final metrics and a link to the
    original."""
    from mlflow.entities import Metric

    run_id = tracking.start_stage_run(
        parent_run_id,
        result["stage"],
        params={"stage_key": result["key"], "checkpoint": result["checkpoint"], "steps": result["steps"]},
        tags={"arl.stage_key": result["key"], "arl.reused_from_run": result["run_id"]},
        tracking_uri=tracking_uri,
    )
    metrics = [Metric(k, float(v), 0, int(result["steps"])) for k, v in result["metrics"].items()]
    tracking.client(tracking_uri).log_batch(run_id, metrics=metrics)
    tracking.end_run(run_id, tracking_uri=tracking_uri)
    get_run_logger().info("%s: reused from run %s (cached)", result["stage"], result["run_id"])
    return {**result, "reused_in_run": run_id}
