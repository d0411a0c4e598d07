"""``offline_to_online_flow``: pull -> validate -> BC -> offline RL -> fine-tuning -> [EWC] -> evaluate -> register -> gate.

Stages 1-3 train a policy on the version asked for. Stage 4 runs when the champion has learned other data
versions: it continues the champion on the new version with an EWC penalty over the champion's chain of
versions, measures forgetting on each of them, and its policy is the one the gate judges (forgetting
included). Without a champion, or when the champion has seen this version, the gate judges stage 3's.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from flows.params import (
    DEFAULT_DATASET,
    DEFAULT_GATE,
    DEFAULT_TRAINING,
    DatasetRef,
    GateConfig,
    TrainingConfig,
)
from tasks import tracking
from tasks.continual import choose_candidate, earlier_versions, measure_candidate
from tasks.data import flow_data_repo, pull_dataset_task
from tasks.evaluate import evaluate_policy, promote_policy, register_stage_policy
from tasks.runs import continual_report, finish_pipeline_run, run_summary, start_pipeline_run, validate_in_run
from tasks.settings import artifact_location, git_commit, state_paths
from tasks.train import record_reused_stage, train_stage


def _retrain_candidate(
    stage: Any, stages: list[dict], start: dict, data: dict, gate: GateConfig, notes: list[str]
) -> tuple[dict, float]:
    """Stage 4 (``stage``; None: skipped after a stage diverged) on a version the champion has not learned,
    and the policy the gate then judges (:func:`tasks.continual.choose_candidate`): of EWC's and the last of
    stages 1-3, the best new-version score among those within the forgetting bound and the cost budget.
    Returns it and its forgetting, which is measured whichever it is."""
    extra = {"previous": start["previous"], "forgetting_episodes": gate.eval_episodes}
    last = stages[-1]
    ewc = stage("ewc", 4, init_from=start, **extra) if stage is not None else None
    measure = (start, data["dir"], gate.eval_episodes, gate.eval_seed)
    options = []
    if ewc is not None:
        stages.append(ewc)
        m = ewc["metrics"]
        known = {"forgetting": m["continual/ewc_mean_forgetting"], "new_score": m["continual/ewc_new_score"]}
        options.append(measure_candidate("ewc", ewc["checkpoint"], *measure, known=known))
    options.append(measure_candidate(last["stage"], last["checkpoint"], *measure))
    budget = gate.cost_budget if gate.cost_budget is not None else options[0]["cost_budget"]
    chosen, why = choose_candidate(options, gate.max_forgetting, budget)
    notes.append(why)
    pick = next(s for s in stages if s["stage"] == chosen)
    return pick, next(o["forgetting"] for o in options if o["stage"] == chosen)


def _stage(
    stage: str,
    n: int,
    dataset: dict,
    settings: dict[str, Any],
    run_id: str,
    uri: str,
    runs: str,
    refresh: bool,
    init_from: dict | None = None,
) -> dict[str, Any]:
    """One training stage: cached across runs; a cache hit gets its own nested run linking the original."""
    get_run_logger().info("stage %d %s", n, stage)
    args = (stage, dataset, settings, run_id, uri, runs, init_from)
    result = train_stage.with_options(refresh_cache=refresh or None)(*args)
    if result["parent_run_id"] != run_id:
        from pathlib import Path

        if not (Path(result["checkpoint"]) / "config.json").is_file():  # the cache outlived the checkpoint
            return train_stage.with_options(refresh_cache=True)(*args)
        result = record_reused_stage(result, run_id, uri)
    return result


@flow(name="offline-to-online", log_prints=True)
def offline_to_online_flow(
    dataset: DatasetRef = DEFAULT_DATASET,
    training: TrainingConfig = DEFAULT_TRAINING,
    gate: GateConfig = DEFAULT_GATE,
    experiment: str | None = None,
    refresh_cache: bool = False,
) -> dict[str, Any]:
    """Train on the exact dataset version asked for; register each stage's policy; gate the last one.

    ``experiment``: MLflow experiment (default ``arl-<task>``). ``refresh_cache``: retrain every stage even
    when a finished result for the same data and config exists.
    """
    logger = get_run_logger()
    paths = state_paths()
    uri = paths.mlflow_uri
    data = pull_dataset_task(
        str(flow_data_repo(dataset.repo, paths.data_repo)), dataset.path, dataset.version
    )
    task_name = data["task"]
    model_name = gate.model_name or f"arl-{task_name}"
    commit = git_commit()
    run_id = start_pipeline_run(
        experiment or f"arl-{task_name}",
        f"{task_name}-{flow_run.get_name() or 'local'}",
        data,
        params={
            "dataset": dataset.model_dump(),
            "training": training.model_dump(),
            "gate": gate.model_dump(),
        },
        tags={
            "arl.task": task_name,
            "arl.dataset.md5": data["md5"],
            "arl.dataset.path": data["path"],
            "arl.git_commit": commit,
            "arl.prefect.flow_run_id": str(flow_run.get_id() or ""),
            "arl.preset": training.preset,
        },
        tracking_uri=uri,
        artifact_location=artifact_location(uri, paths),
    )
    failed_stage = "validate"
    try:
        validation = validate_in_run(data["dir"], run_id, uri)
        runs = str(paths.runs)

        from arl_models.train import TrainingDiverged

        notes: list[str] = []

        def stage(name: str, n: int, init_from: dict | None = None, **extra: Any) -> dict[str, Any] | None:
            """The stage's result; None when it diverged (the run goes on with what it has, and says so)."""
            nonlocal failed_stage
            failed_stage = name
            settings = training.stage_settings(name) | extra
            try:
                return _stage(name, n, data, settings, run_id, uri, runs, refresh_cache, init_from)
            except TrainingDiverged as e:
                if name == "bc":
                    raise
                logger.warning("stage %s diverged: %s", name, e)
                notes.append(f"stage {name} diverged ({e})")
                return None

        stages = [stage("bc", 1)]
        for name, n, wanted in (("offline", 2, True), ("finetune", 3, training.finetune_steps != 0)):
            done = stage(name, n, init_from=stages[-1]) if wanted and not notes else None
            stages += [done] if done else []
        diverged = bool(notes)
        final, forgetting = stages[-1], None
        if training.continual_steps != 0:
            failed_stage = "ewc"
            start = earlier_versions(model_name, data, data["repo"], runs, uri)
            if start is not None:
                final, forgetting = _retrain_candidate(
                    stage if not diverged else None, stages, start, data, gate, notes
                )
        if diverged:
            notes.append(f"the gate judges {final['stage']}")
        failed_stage = "evaluate"
        evaluation = evaluate_policy(
            final["checkpoint"], final["stage"], run_id, uri, gate.eval_episodes, gate.eval_seed
        )
        failed_stage = "register"
        versions = [register_stage_policy(s, data, model_name, commit, uri) for s in stages]
        failed_stage = "promote"
        candidate = {
            "score": evaluation["score"],
            "references": evaluation["references"],
            "mean_cost": evaluation["mean_cost"],
            "forgetting": forgetting,
            "data_validated": bool(validation.get("validated")),
        }
        budget = gate.cost_budget if gate.cost_budget is not None else evaluation["cost_budget"]
        decision = promote_policy(
            model_name,
            versions[stages.index(final)]["version"],
            candidate,
            tolerance=gate.tolerance,
            cost_budget=budget,
            max_forgetting=gate.max_forgetting,
            parent_run_id=run_id,
            tracking_uri=uri,
            scored_as={
                "policy": evaluation["policy"],
                "episodes": gate.eval_episodes,
                "seed": gate.eval_seed,
                "runs_dir": runs,
            },
            note="; ".join(notes),
            siblings=[v["version"] for v, s in zip(versions, stages, strict=True) if s is not final],
        )
    except BaseException as e:
        logger.error("pipeline failed in stage %s: %s", failed_stage, e)
        finish_pipeline_run(
            run_id, "FAILED", uri, tags={"arl.failed_stage": failed_stage, "arl.error": str(e)}
        )
        raise
    report = continual_report(stages[-1])
    if report:
        tracking.log_forgetting_plot(run_id, report, tracking_uri=uri)
    finish_pipeline_run(run_id, "FINISHED", uri, metrics=run_summary(stages, evaluation, forgetting))
    logger.info(
        "%s version %s is %s: %s", model_name, decision["version"], decision["alias"], decision["reason"]
    )
    return {
        "run_id": run_id,
        "dataset": data,
        "stages": {s["stage"]: s for s in stages},
        "evaluation": evaluation,
        "versions": versions,
        "decision": decision,
        "tracking_uri": uri,
    }
