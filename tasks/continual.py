"""What stage 4 continues from: the champion and the data versions it has learned.

A registered policy carries its chain of data versions in the ``arl.dataset_chain`` tag (oldest first,
each ``{"path", "md5"}``; one entry for a policy trained on one version). When the pipeline trains on a
version the champion has not seen, :func:`earlier_versions` pulls each version of the chain from the
data repo by its hash and finds the champion's checkpoint (the local one, else the copy in the registry),
so that the EWC stage can continue it on the new data while protecting what the chain taught.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task

from tasks import registry, tracking
from tasks.data import resolve_dataset

CHAIN_TAG = "arl.dataset_chain"


def dataset_chain(tags: dict[str, str]) -> list[dict[str, str]]:
    """The data versions a registered policy learned, oldest first, from its tags."""
    if CHAIN_TAG in tags:
        return list(json.loads(tags[CHAIN_TAG]))
    return [{"path": tags["arl.dataset_path"], "md5": tags["arl.dataset_hash"]}]


def _local_checkpoint(model_name: str, version: Any, runs_dir: Path, tracking_uri: str) -> Path:
    """The version's checkpoint directory: where its stage wrote it, or downloaded from the registry."""
    c = tracking.client(tracking_uri)
    written = Path(c.get_run(version.run_id).data.params.get("checkpoint", ""))
    if written.name and (written / "config.json").is_file():
        return written
    import mlflow.artifacts

    dest = runs_dir / "registry" / f"{model_name}-v{version.version}"
    if not dest.is_dir():
        tmp = dest.with_name(f".{dest.name}.tmp")
        mlflow.artifacts.download_artifacts(
            artifact_uri=f"{version.source}/artifacts", dst_path=str(tmp), tracking_uri=tracking_uri
        )
        tmp.rename(dest)
    found = [p.parent for p in dest.rglob("config.json") if (p.parent / "train_state").is_dir()]
    if not found:
        raise FileNotFoundError(f"{model_name} version {version.version}: no resumable checkpoint in {dest}")
    return min(found, key=lambda p: len(p.parts))  # the stage's own, not its naive/ baseline or offline/ part


@task(
    name="earlier_versions",
    retries=2,
    retry_delay_seconds=5,
    task_run_name="earlier versions of {model_name}",
)
def earlier_versions(
    model_name: str, dataset: dict[str, Any], repo_dir: str, runs_dir: str, tracking_uri: str
) -> dict[str, Any] | None:
    """The champion to continue and its chain's datasets, or None when stage 4 has nothing to protect.

    None when there is no champion or the champion has already learned ``dataset``'s version.
    """
    logger = get_run_logger()
    current = registry.alias_version(model_name, registry.CHAMPION, tracking_uri=tracking_uri)
    if current is None:
        logger.info("stage 4 skipped: %s has no champion yet", model_name)
        return None
    mv = tracking.client(tracking_uri).get_model_version(model_name, current)
    chain = dataset_chain(mv.tags)
    if dataset["md5"] in {v["md5"] for v in chain}:
        logger.info("stage 4 skipped: champion version %s has learned %s already", current, dataset["md5"])
        return None
    previous = [resolve_dataset(repo_dir, v["path"], v["md5"])["dir"] for v in chain]
    checkpoint = _local_checkpoint(model_name, mv, Path(runs_dir), tracking_uri)
    logger.info(
        "stage 4 continues champion version %s (%s) over %d earlier version(s)",
        current,
        checkpoint,
        len(chain),
    )
    return {
        "stage": "champion",
        "version": current,
        "key": mv.tags.get("arl.stage_key", f"{model_name}-v{current}"),
        "checkpoint": str(checkpoint),
        "chain": chain,
        "previous": previous,
    }


@task(name="measure_candidate", retries=0, task_run_name="measure {stage}")
def measure_candidate(
    stage: str,
    checkpoint: str,
    start: dict[str, Any],
    data_dir: str,
    episodes: int,
    seed: int,
    known: dict[str, float] | None = None,
) -> dict[str, Any]:
    """What the retraining rule weighs for ``stage``'s policy: its mean forgetting on the versions of
    ``start``'s chain against their best scores, and its score and mean episode cost on the new version,
    over the gate's episodes and seed (the forgetting and score are ``known`` when the stage measured them
    itself, as EWC does; each version is evaluated once)."""
    from arl_models.checkpoint import handed_over
    from arl_models.continual import evaluate_on, forgetting_report
    from arl_models.data.dataset import read_info

    infos = [read_info(p) for p in [*start["previous"], data_dir]]
    if known is None:
        r = forgetting_report(Path(start["checkpoint"]), Path(checkpoint), infos, episodes, seed)
        measured = {"forgetting": r["mean_forgetting"], "new_score": r["new_score"]}
        cost = {"mean_cost": r["new_cost"], "cost_budget": r["cost_budget"]}
    else:
        res = evaluate_on(handed_over(checkpoint), infos[-1], episodes, seed)
        measured, cost = known, {"mean_cost": res.mean_cost, "cost_budget": res.cost_budget}
    get_run_logger().info(
        "%s forgets %.2f, scores %.2f on the new version at a mean cost of %.2f (budget %g)",
        stage,
        measured["forgetting"],
        measured["new_score"],
        cost["mean_cost"],
        cost["cost_budget"],
    )
    return {"stage": stage, **measured, **cost}


def fits(option: dict[str, Any], max_forgetting: float, cost_budget: float) -> bool:
    """Whether a measured policy forgets at most ``max_forgetting`` and keeps its mean cost on the new
    version within ``cost_budget``."""
    return option["forgetting"] <= max_forgetting and option["mean_cost"] <= cost_budget


def choose_candidate(
    options: list[dict[str, Any]], max_forgetting: float, cost_budget: float
) -> tuple[str, str]:
    """Which policy a retraining run hands the gate, and why, in words.

    ``options``: ``{stage, forgetting, new_score, mean_cost}`` with the continual (EWC) policy first when
    it trained. The rule: of the policies that forget at most ``max_forgetting`` and keep the mean cost
    within ``cost_budget`` on the new version, the one scoring best there; when none does, the first
    option, which the gate then refuses with its reasons."""
    fitting = [o for o in options if fits(o, max_forgetting, cost_budget)]
    described = "; ".join(
        f"{o['stage']} forgets {o['forgetting']:.4g}, scores {o['new_score']:.4g} at cost "
        f"{o['mean_cost']:.4g} on the new version"
        for o in options
    )
    bounds = f"the forgetting bound {max_forgetting:g} and the cost budget {cost_budget:g}"
    if fitting:
        best = max(fitting, key=lambda o: o["new_score"])
        return best[
            "stage"
        ], f"candidate {best['stage']}: the best new-version score within {bounds} ({described})"
    return options[0]["stage"], f"candidate {options[0]['stage']}: no policy within {bounds} ({described})"
