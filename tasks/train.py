"""Training stages as Prefect tasks: one coarse task per stage, logged to a nested MLflow run.

A stage is a pure function of (dataset hash, stage, library config, seed, steps, upstream stage), so its
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
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from tasks import tracking

STAGES = ("bc", "offline", "finetune", "ewc")
NOT_IN_KEY = ("threads",)
"""Settings that change how fast a stage runs, not what it computes: a stage keeps its key with any of them."""
COMPLETION_KEY = {"ewc": "continual/ewc_mean_forgetting"}
"""A metric a stage writes only once it has finished everything (EWC: after measuring forgetting)."""
CURVES = {
    "learning_curve.png": lambda k: (
        k.startswith("train/loss_") or k in ("eval/normalized_score", "train/q_data")
    ),
    "cost_curve.png": lambda k: any(
        w in k for w in ("cost", "lagrange", "over_budget", "violation", "conservative")
    ),
}


def offline_algo(settings: dict[str, Any]) -> str:
    """Stage 2's algorithm: the form's choice, else the preset's (the library's default)."""
    from arl_models.presets import get_preset

    return settings.get("offline_algo") or get_preset(settings["preset"]).offline_algo


def library_config(stage: str, preset: str, algo: str | None = None) -> dict[str, Any]:
    """The algorithm config the library will use for ``stage`` under ``preset`` (part of the cache key);
    ``algo``: stage 2's algorithm (default: the preset's)."""
    from arl_models.presets import get_preset

    p = get_preset(preset)
    if stage == "finetune":
        from arl_models.online import FinetuneConfig

        return {"config": dataclasses.asdict(FinetuneConfig()), "default_steps": p.finetune_steps}
    if stage == "ewc":
        from arl_models.continual import ContinualConfig

        return {"config": dataclasses.asdict(ContinualConfig()), "default_steps": p.continual_steps}
    cfg, steps = (p.bc, p.bc_steps) if stage == "bc" else (p.offline_config(algo), p.offline_steps_of(algo))
    # the conditioning follows the dataset's task (arl_models.offline.conditioning); the run is tagged with it
    return {"config": dataclasses.asdict(cfg) | {"context_dim": "task"}, "default_steps": steps}


def stage_key(stage: str, dataset_md5: str, settings: dict[str, Any], upstream_key: str | None) -> str:
    """sha256 of everything that determines a stage's output, the networks' layout included."""
    from arl_models import nets

    blob = json.dumps(
        {
            "stage": stage,
            "dataset": dataset_md5,
            "settings": {k: v for k, v in settings.items() if k not in NOT_IN_KEY},
            "library": library_config(stage, settings["preset"], settings.get("offline_algo")),
            "layout": nets.layout_signature(),
            "upstream": upstream_key,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def _cache_key(context: Any, parameters: dict[str, Any]) -> str:
    upstream = parameters.get("init_from") or {}
    return "arl-stage-" + stage_key(
        parameters["stage"], parameters["dataset"]["md5"], parameters["settings"], upstream.get("key")
    )


def checkpoint_dir(runs_dir: str | Path, dataset_md5: str, stage: str, key: str) -> Path:
    return Path(runs_dir) / dataset_md5.removesuffix(".dir")[:12] / f"{stage}-{key[:12]}"


def _finished(out: Path, stage: str, steps: int) -> dict[str, float] | None:
    """The final metrics of a checkpoint that completed ``steps`` (and, for EWC, measured forgetting)."""
    from arl_models.checkpoint import finished

    metrics = finished(out, steps)
    return metrics if metrics is not None and COMPLETION_KEY.get(stage, "wall_time_s") in metrics else None


def _target_steps(stage: str, settings: dict[str, Any]) -> int:
    return int(
        settings.get("steps")
        or library_config(stage, settings["preset"], settings.get("offline_algo"))["default_steps"]
    )


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


def _train(
    stage: str, data_dir: str, out: Path, settings: dict[str, Any], init_actor: str | None, sink: Any
) -> dict:
    from arl_models.offline import train_bc, train_offline_algo

    common = {
        "preset": settings["preset"],
        "seed": settings["seed"],
        "steps": settings.get("steps"),
        "sink": sink,
        "progress": sys.stderr.isatty(),
        "eval_episodes": settings.get("eval_episodes"),
    }
    if stage == "bc":
        return train_bc(data_dir, out, **common)
    if stage == "finetune":
        from arl_models.online import finetune

        cfg = _finetune_config(settings, _target_steps(stage, settings))
        return finetune(init_actor, out, data=data_dir, config=cfg, sink=sink, progress=common["progress"])
    if stage == "ewc":
        return _continual(init_actor, data_dir, out, settings, sink, common["progress"])
    return train_offline_algo(
        offline_algo(settings),
        data_dir,
        out,
        init_actor=init_actor,
        constrained=settings.get("constrained", True),
        **common,
    )


def _finetune_config(settings: dict[str, Any], steps: int) -> Any:
    """Constrained fine-tuning as the form asks for it (stage 3, and stage 4's online part)."""
    from arl_models.online import FinetuneConfig
    from arl_models.presets import get_preset

    episodes = settings.get("eval_episodes")
    return FinetuneConfig(
        seed=settings["seed"],
        steps=steps,
        vector=settings.get("vector", "sync"),
        num_envs=settings.get("num_envs", 4),
        cost_budget=settings.get("cost_budget"),
        eval_episodes=get_preset(settings["preset"]).eval_episodes if episodes is None else episodes,
    )


def _continual(
    start: str | None, data_dir: str, out: Path, settings: dict[str, Any], sink: Any, progress: bool
) -> dict:
    """Stage 4: continue ``start`` on the new data with EWC over ``settings["previous"]`` (offline, then
    constrained fine-tuning on the new version under the same penalty, as stage 3 does after stage 2, so the
    policy it hands over is held to the budget too); measure forgetting."""
    from arl_models.algos.ewc import EWCConfig
    from arl_models.continual import ContinualConfig, train_continual
    from arl_models.presets import get_preset, with_given

    if start is None or not settings.get("previous"):
        raise ValueError("the ewc stage needs the champion to continue (init_from) and its earlier datasets")
    seed = settings["seed"]
    online = settings.get("online_steps")
    online = get_preset(settings["preset"]).finetune_steps if online is None else online
    cfg = ContinualConfig(
        seed=seed,
        steps=_target_steps("ewc", settings),
        ewc=with_given(EWCConfig(seed=seed), weight=settings.get("ewc_weight")),
        rehearsal=settings.get("rehearsal", 0.0),
        baseline=False,  # the naive baseline is the benchmark's business, not every run's
        eval_episodes=settings["forgetting_episodes"],
        online_steps=online,
        finetune=_finetune_config(settings, online),
    )
    train_continual(
        start, data_dir, out, previous=settings["previous"], config=cfg, sink=sink, progress=progress
    )
    return json.loads((out / "metrics.json").read_text())


@task(
    name="train_stage",
    task_run_name="train {stage}",
    cache_key_fn=_cache_key,
    persist_result=True,
    result_serializer="json",  # a cache hit reads JSON back: a persisted result is never unpickled
    retries=0,  # training is not I/O: a retry would repeat the same failure; a killed process resumes instead
)
def train_stage(
    stage: str,
    dataset: dict[str, Any],
    settings: dict[str, Any],
    parent_run_id: str,
    tracking_uri: str,
    runs_dir: str,
    init_from: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train ``stage`` (``bc`` | ``offline`` | ``finetune`` | ``ewc``) on the pulled dataset; returns the
    checkpoint and its metrics.

    ``settings``: ``preset``, ``seed``, ``steps`` (None: the preset's), ``eval_episodes``, ``constrained``,
    ``offline_algo`` (stage 2's: ``cql`` | ``td3bc`` | ``iql``; None: the preset's);
    for ``ewc`` also ``ewc_weight``, ``rehearsal``, ``previous`` (the earlier versions' dataset directories, oldest first)
    and ``forgetting_episodes``. ``init_from``: the upstream stage's result (stage 2 starts its actor from BC's,
    fine-tuning from CQL's, EWC from the champion found by :func:`tasks.continual.earlier_versions`).
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; known: {STAGES}")
    logger = get_run_logger()
    key = stage_key(stage, dataset["md5"], settings, (init_from or {}).get("key"))
    out = checkpoint_dir(runs_dir, dataset["md5"], stage, key)
    steps = _target_steps(stage, settings)
    params = {
        **settings,
        "steps": steps,
        "stage_key": key,
        "checkpoint": str(out),
        **{
            f"algo.{k}": v
            for k, v in library_config(stage, settings["preset"], settings.get("offline_algo"))[
                "config"
            ].items()
        },
        "init_from": (init_from or {}).get("checkpoint", ""),
    }
    run_id = tracking.start_stage_run(
        parent_run_id, stage, params=params, tags={"arl.stage_key": key}, tracking_uri=tracking_uri
    )
    try:
        final = _finished(out, stage, steps)
        if final is not None:
            logger.info("%s: reusing the finished checkpoint %s", stage, out)
            tracking.client(tracking_uri).set_tag(run_id, "arl.reused_checkpoint", "true")
        else:
            from arl_models.presets import apply_threads

            threads = apply_threads(settings["preset"], settings.get("threads"))
            logger.info(
                "%s: training %d steps into %s (%d torch thread%s)",
                stage,
                steps,
                out,
                threads,
                "s"[: threads > 1],
            )
            with tracking.MlflowSink(run_id, tracking_uri=tracking_uri, every=10) as sink:
                final = _train(
                    stage, dataset["dir"], out, settings, (init_from or {}).get("checkpoint"), sink
                )
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
    logger.info(
        "%s done: %s",
        stage,
        {k: round(v, 3) for k, v in final.items() if k.startswith(("eval/", "train/loss", "online/cumul"))},
    )
    here = {"path": dataset["path"], "md5": dataset["md5"]}
    return {
        "stage": stage,
        "key": key,
        "chain": [*(init_from or {}).get("chain", []), here] if stage == "ewc" else [here],
        "checkpoint": str(out),
        "metrics": final,
        "run_id": run_id,
        "parent_run_id": parent_run_id,
        "steps": steps,
        "seed": settings["seed"],
    }


@task(name="record_reused_stage", retries=2, retry_delay_seconds=2, task_run_name="reuse {result[stage]}")
def record_reused_stage(result: dict[str, Any], parent_run_id: str, tracking_uri: str) -> dict[str, Any]:
    """A cached stage still gets its nested run in this pipeline run: final metrics and a link to the original."""
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
