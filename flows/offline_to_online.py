"""``offline_to_online_flow``: pull -> validate -> train -> evaluate -> register -> gate.

A first run, or a run on a version the champion has learned, trains stages 1-3 on the version asked for
(BC, offline RL from it, fine-tuning from that) and the gate judges stage 3's policy. A retraining run (a
version the champion has not learned) continues the champion instead: stage 4 trains it on the new version
under an EWC penalty over the champion's chain of versions and measures forgetting on each of them. Its
policy is the candidate when it forgets within the gate's bound and keeps the mean cost within the budget;
otherwise (or when stage 4 diverges) stages 1-3 train the new version from scratch and the gate judges
the better of the two by :func:`tasks.continual.choose_candidate`. A failure tags the MLflow run with its
stage (:mod:`tasks.failures`).
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
from tasks.continual import choose_candidate, earlier_versions, fits, measure_candidate
from tasks.data import flow_data_repo, pull_dataset_task
from tasks.evaluate import evaluate_policy, promote_policy, register_stage_policy
from tasks.failures import end_failed_pipeline_run, tag_failed_stage
from tasks.runs import continual_report, finish_pipeline_run, run_summary, start_pipeline_run, validate_in_run
from tasks.settings import artifact_location, git_commit, state_paths
from tasks.stages import StageSpec
from tasks.train import STAGE_VERBS, run_stage

HOOKED = {"on_failure": [tag_failed_stage]}
"""Every task of the pipeline tags the parent run with its stage when it fails (:mod:`tasks.failures`)."""


class _Stages:
    """The pipeline's training stages in order, each run through its verb; a stage that diverges (other
    than BC, which everything needs) is left out, and the run goes on with what it has and says so."""

    def __init__(
        self, specs: dict[str, StageSpec], data: dict, run_id: str, uri: str, runs: str, refresh: bool
    ):
        self.specs, self.data, self.where, self.refresh = specs, data, (run_id, uri, runs), refresh
        self.done: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def run(self, name: str, **inputs: Any) -> dict[str, Any] | None:
        from arl_models.train import TrainingDiverged

        get_run_logger().info("stage %s (%s)", name, self.specs[name].algo)
        verb = STAGE_VERBS[name].with_options(**HOOKED)
        try:
            result = run_stage(verb, self.specs[name], self.data, *self.where, refresh=self.refresh, **inputs)
        except TrainingDiverged as e:
            if name == "bc":
                raise
            get_run_logger().warning("stage %s diverged: %s", name, e)
            self.notes.append(f"stage {name} diverged ({e})")
            return None
        self.done.append(result)
        return result

    @property
    def diverged(self) -> bool:
        return any(n.startswith("stage ") for n in self.notes)


def _train_new_version(stages: _Stages, finetune: bool) -> dict[str, Any]:
    """Stages 1-3 on the version asked for: BC, offline RL from it, fine-tuning from that; a stage after
    one that diverged does not run. Returns the last that trained."""
    last = stages.run("bc")
    assert last is not None  # BC's divergence fails the run
    for name, wanted in (("offline", True), ("finetune", finetune)):
        result = stages.run(name, init_from=last) if wanted else None
        if result is None:
            break
        last = result
    return last


def _budget(gate: GateConfig, measured: dict[str, Any]) -> float:
    """The gate's cost budget, else the task's (as the candidate was measured against)."""
    return gate.cost_budget if gate.cost_budget is not None else measured["cost_budget"]


def _retrain(stages: _Stages, start: dict, gate: GateConfig, finetune: bool) -> tuple[dict, float]:
    """A version the champion has not learned: stage 4 continues the champion on it. When its policy
    forgets within the bound and keeps the mean cost within the budget it is the candidate; otherwise (or
    when stage 4 diverged) stages 1-3 train the version from scratch and
    :func:`tasks.continual.choose_candidate` picks between the two. Returns the candidate and its
    forgetting, which is measured whichever it is."""
    measure = (start, stages.data["dir"], gate.eval_episodes, gate.eval_seed)
    measured = measure_candidate.with_options(**HOOKED)
    options = []
    ewc = stages.run("ewc", init_from=start, previous=start["previous"])
    if ewc is not None:
        m = ewc["metrics"]
        known = {"forgetting": m["continual/ewc_mean_forgetting"], "new_score": m["continual/ewc_new_score"]}
        options.append(measured("ewc", ewc["checkpoint"], *measure, known=known))
    if not options or not fits(options[0], gate.max_forgetting, _budget(gate, options[0])):
        get_run_logger().info("stage 4's policy is outside the gate's bounds: stages 1-3 train from scratch")
        last = _train_new_version(stages, finetune)
        options.append(measured(last["stage"], last["checkpoint"], *measure))
    chosen, why = choose_candidate(options, gate.max_forgetting, _budget(gate, options[0]))
    stages.notes.append(why)
    pick = next(s for s in stages.done if s["stage"] == chosen)
    return pick, next(o["forgetting"] for o in options if o["stage"] == chosen)


def _start_run(
    dataset: DatasetRef,
    training: TrainingConfig,
    gate: GateConfig,
    experiment: str | None,
    data: dict,
    specs: dict[str, StageSpec],
    uri: str,
    paths: Any,
) -> str:
    """The pipeline's parent MLflow run, with the form as params and the trace as tags (stage 2's
    algorithm and steps as resolved for the task among them)."""
    task_name = data["task"]
    return start_pipeline_run(
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
            "arl.git_commit": git_commit(),
            "arl.prefect.flow_run_id": str(flow_run.get_id() or ""),
            "arl.preset": training.preset,
            "arl.offline_algo": specs["offline"].algo,
            "arl.offline_steps": str(specs["offline"].steps),
        },
        tracking_uri=uri,
        artifact_location=artifact_location(uri, paths),
    )


def _judge(
    stages: _Stages,
    final: dict[str, Any],
    forgetting: float | None,
    validation: dict[str, Any],
    gate: GateConfig,
    model_name: str,
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Score ``final`` (the stage the gate judges) on the gate's episodes, register every stage's policy,
    and let the gate promote or refuse ``final``'s; returns the evaluation, the versions and the decision."""
    run_id, uri, runs = stages.where
    evaluation = evaluate_policy.with_options(**HOOKED)(
        final["checkpoint"], final["stage"], run_id, uri, gate.eval_episodes, gate.eval_seed
    )
    register = register_stage_policy.with_options(**HOOKED)
    versions = [register(s, stages.data, model_name, git_commit(), uri) for s in stages.done]
    decision = promote_policy.with_options(**HOOKED)(
        model_name,
        versions[stages.done.index(final)]["version"],
        {
            "score": evaluation["score"],
            "references": evaluation["references"],
            "mean_cost": evaluation["mean_cost"],
            "forgetting": forgetting,
            "data_validated": bool(validation.get("validated")),
        },
        tolerance=gate.tolerance,
        cost_budget=gate.cost_budget if gate.cost_budget is not None else evaluation["cost_budget"],
        max_forgetting=gate.max_forgetting,
        parent_run_id=run_id,
        tracking_uri=uri,
        scored_as={
            "policy": evaluation["policy"],
            "episodes": gate.eval_episodes,
            "seed": gate.eval_seed,
            "runs_dir": runs,
        },
        note="; ".join(stages.notes),
        siblings=[v["version"] for v, s in zip(versions, stages.done, strict=True) if s is not final],
    )
    return evaluation, versions, decision


@flow(
    name="offline-to-online",
    log_prints=True,
    on_failure=[end_failed_pipeline_run],
    on_crashed=[end_failed_pipeline_run],
)
def offline_to_online_flow(
    dataset: DatasetRef = DEFAULT_DATASET,
    training: TrainingConfig = DEFAULT_TRAINING,
    gate: GateConfig = DEFAULT_GATE,
    experiment: str | None = None,
    refresh_cache: bool = False,
) -> dict[str, Any]:
    """Train on the exact dataset version asked for; register each stage's policy; gate the one chosen.

    ``experiment``: MLflow experiment (default ``arl-<task>``). ``refresh_cache``: retrain every stage even
    when a finished result for the same data and config exists.
    """
    paths = state_paths()
    uri, runs = paths.mlflow_uri, str(paths.runs)
    data = pull_dataset_task(
        str(flow_data_repo(dataset.repo, paths.data_repo)), dataset.path, dataset.version
    )
    model_name = gate.model_name or f"arl-{data['task']}"
    specs = training.stage_specs(data["task"], gate.eval_episodes)
    run_id = _start_run(dataset, training, gate, experiment, data, specs, uri, paths)
    validation = validate_in_run.with_options(**HOOKED)(data["dir"], run_id, uri)

    stages = _Stages(specs, data, run_id, uri, runs, refresh_cache)
    finetune = training.finetune_steps != 0
    start = None
    if training.continual_steps != 0:
        start = earlier_versions.with_options(**HOOKED)(model_name, data, data["repo"], runs, uri)
    if start is None:
        final, forgetting = _train_new_version(stages, finetune), None
    else:
        final, forgetting = _retrain(stages, start, gate, finetune)
    if stages.diverged:
        stages.notes.append(f"the gate judges {final['stage']}")

    evaluation, versions, decision = _judge(stages, final, forgetting, validation, gate, model_name)
    report = continual_report(stages.done[0])
    if report:
        tracking.log_forgetting_plot(run_id, report, bound=gate.max_forgetting, tracking_uri=uri)
    finish_pipeline_run(run_id, "FINISHED", uri, metrics=run_summary(stages.done, evaluation, forgetting))
    get_run_logger().info(
        "%s version %s is %s: %s", model_name, decision["version"], decision["alias"], decision["reason"]
    )
    return {
        "run_id": run_id,
        "dataset": data,
        "stages": {s["stage"]: s for s in stages.done},
        "evaluation": evaluation,
        "versions": versions,
        "decision": decision,
        "tracking_uri": uri,
    }
