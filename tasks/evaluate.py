"""Evaluate, register and promote: the tasks after training.

``evaluate_policy`` runs the final policy in its environment under a nested ``evaluate`` run;
``register_stage_policy`` turns a stage's checkpoint into a model version with its trace tags (cached
by checkpoint, so a re-run pipeline does not register the same checkpoint twice); ``promote_policy``
applies the gate of :mod:`tasks.registry` and records the verdict on the parent run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from tasks import registry, tracking


@task(name="evaluate_policy", retries=0, task_run_name="evaluate {stage}")
def evaluate_policy(
    checkpoint: str, stage: str, parent_run_id: str, tracking_uri: str, episodes: int, seed: int
) -> dict[str, Any]:
    """Episodes of the policy the stage hands over (``best/`` of a fine-tuning checkpoint, else the
    checkpoint's own weights), in its own task; returns the gate's inputs (score, mean cost) and all metrics.

    ``score`` is the normalised score (0 random, 100 expert) where the dataset has reference returns,
    else the mean return.
    """
    from arl_models.checkpoint import handed_over, read_config
    from arl_models.offline import evaluate_checkpoint

    policy = handed_over(checkpoint)
    run_id = tracking.start_stage_run(
        parent_run_id,
        "evaluate",
        params={
            "policy_stage": stage,
            "episodes": episodes,
            "seed": seed,
            "checkpoint": checkpoint,
            "policy": str(policy),
        },
        tracking_uri=tracking_uri,
    )
    try:
        res = evaluate_checkpoint(policy, episodes=episodes, seed=seed)
        metrics = res.metrics()
        with tracking.MlflowSink(run_id, tracking_uri=tracking_uri) as sink:
            sink.log(metrics, 0)
    except BaseException:
        tracking.end_run(run_id, "FAILED", tracking_uri=tracking_uri)
        raise
    tracking.end_run(run_id, tracking_uri=tracking_uri)
    score = res.normalized_score if res.normalized_score is not None else res.mean_return
    env = read_config(policy)["env"]
    refs = (env.get("ref_random_return"), env.get("ref_expert_return"))
    references = "none" if res.normalized_score is None else f"random {refs[0]:g}, expert {refs[1]:g}"
    get_run_logger().info(
        "evaluate %s: score %.2f, mean cost %.2f (budget %g) over %d episodes",
        stage,
        score,
        res.mean_cost,
        res.cost_budget,
        res.episodes,
    )
    return {
        "score": float(score),
        "references": references,
        "policy": str(policy),
        "mean_cost": res.mean_cost,
        "cost_budget": res.cost_budget,
        "metrics": metrics,
        "run_id": run_id,
        "episodes": res.episodes,
    }


def _register_key(context: Any, parameters: dict[str, Any]) -> str:
    s = parameters["stage_result"]
    return f"arl-register-{parameters['model_name']}-{s['key']}-{parameters['tracking_uri']}"


@task(
    name="register_policy",
    task_run_name="register {stage_result[stage]}",
    cache_key_fn=_register_key,
    persist_result=True,
    result_serializer="json",  # a cache hit reads JSON back: a persisted result is never unpickled
    retries=2,
    retry_delay_seconds=5,
)
def register_stage_policy(
    stage_result: dict[str, Any], dataset: dict[str, Any], model_name: str, git_commit: str, tracking_uri: str
) -> dict[str, str]:
    """Register the stage's checkpoint (as a loadable pyfunc) under its own stage run; the tag
    ``arl.served_policy`` says which of its policies the model serves (``best`` or ``last`` weights)."""
    from arl_models.checkpoint import handed_over

    checkpoint = Path(stage_result["checkpoint"])
    reg = registry.register_policy(
        checkpoint,
        model_name=model_name,
        run_id=stage_result["run_id"],
        tags={
            "stage": stage_result["stage"],
            "dataset_hash": dataset["md5"],
            "env_version": dataset["env_version"],
            "policy_hash": dataset["policy_hash"],
            "seed": stage_result["seed"],
            "git_commit": git_commit,
            "dataset_path": dataset["path"],
            "stage_key": stage_result["key"],
            "dataset_chain": json.dumps(
                stage_result.get("chain") or [{"path": dataset["path"], "md5": dataset["md5"]}]
            ),
            "served_policy": "best" if handed_over(checkpoint) != checkpoint else "last",
        },
        tracking_uri=tracking_uri,
    )
    get_run_logger().info("registered %s as %s version %s", stage_result["stage"], reg.name, reg.version)
    return {"name": reg.name, "version": reg.version, "source": reg.source, "stage": stage_result["stage"]}


def _rescorer(
    model_name: str, candidate: dict[str, Any], scored_as: dict[str, Any], tracking_uri: str
) -> Callable[[str], dict[str, Any]]:
    """Score a registered version on the candidate's task version, references, episodes and seed."""

    def rescore(version: str) -> dict[str, Any]:
        from arl_models.checkpoint import handed_over, read_config
        from arl_models.offline import evaluate_checkpoint, record_references
        from tasks.continual import _local_checkpoint

        record = read_config(scored_as["policy"])
        env = record["env"]
        mv = tracking.client(tracking_uri).get_model_version(model_name, version)
        ckpt = handed_over(_local_checkpoint(model_name, mv, Path(scored_as["runs_dir"]), tracking_uri))
        res = evaluate_checkpoint(
            ckpt,
            f"{env['task']}@{env['env_version']}",
            scored_as["episodes"],
            scored_as["seed"],
            ref_scores=record_references(record),
        )
        score = res.normalized_score if res.normalized_score is not None else res.mean_return
        return {"score": float(score), "references": candidate.get("references")}

    return rescore


@task(name="promote_policy", retries=2, retry_delay_seconds=5, task_run_name="gate {model_name} v{version}")
def promote_policy(
    model_name: str,
    version: str,
    candidate: dict[str, Any],
    *,
    tolerance: float,
    cost_budget: float,
    max_forgetting: float,
    parent_run_id: str,
    tracking_uri: str,
    scored_as: dict[str, Any] | None = None,
    note: str = "",
    siblings: list[str] | None = None,
) -> dict[str, Any]:
    """The promotion gate: ``champion`` or ``challenger`` with the reason; recorded on the parent run too.

    ``scored_as``: how the candidate was scored (``policy``, ``episodes``, ``seed``, ``runs_dir``), so that a
    champion scored against other references is scored again the same way before the two are compared.
    ``note``: how the run chose its candidate (a diverged stage, the retraining rule), put before the reason.
    ``siblings``: the other versions the run registered (its other stages' policies), tagged as not gated,
    with the candidate's verdict, so that none of them reads as a policy the gate let through."""
    logger = get_run_logger()
    decision = registry.promote(
        model_name,
        version,
        candidate,
        tolerance=tolerance,
        cost_budget=cost_budget,
        max_forgetting=max_forgetting,
        tracking_uri=tracking_uri,
        rescore=_rescorer(model_name, candidate, scored_as, tracking_uri) if scored_as else None,
        note=note,
    )
    alias = registry.CHAMPION if decision.promote else registry.CHALLENGER
    c = tracking.client(tracking_uri)
    for k, v in {
        "arl.model": f"{model_name}/{version}",
        "arl.promotion": alias,
        "arl.promotion.reason": decision.reason[:5000],
    }.items():
        c.set_tag(parent_run_id, k, v)
    for other in siblings or []:
        c.set_model_version_tag(model_name, other, "arl.promotion", "not gated")
        c.set_model_version_tag(
            model_name,
            other,
            "arl.promotion.reason",
            f"a stage policy of the run; the run's candidate, version {version}, was judged {alias}",
        )
    (logger.info if decision.promote else logger.warning)(
        "%s version %s -> %s: %s", model_name, version, alias, decision.reason
    )
    return {
        "model": model_name,
        "version": version,
        "alias": alias,
        "promoted": decision.promote,
        "reason": decision.reason,
        "previous_champion": decision.previous_champion,
    }
