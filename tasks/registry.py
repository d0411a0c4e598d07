"""The MLflow model registry and the promotion gate.

:func:`register_policy` turns a policy checkpoint directory into a registered model version (a pyfunc
built from code, so nothing is pickled), tagged with everything needed to trace it: stage, dataset hash,
env version, behaviour-policy hash, seed, git commit. :func:`promotion_decision` is the gate, a pure
function; :func:`promote` applies it in the registry: the version becomes ``champion`` or ``challenger``,
and the reason is recorded as a tag either way.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.tracking import client

CHAMPION, CHALLENGER = "champion", "challenger"
TRACE_TAGS = ("stage", "dataset_hash", "env_version", "policy_hash", "seed", "git_commit")
SCORE, MEAN_COST, FORGETTING, VALIDATED = "score", "mean_cost", "forgetting", "data_validated"
REFERENCES = "references"
"""The (random, expert) returns a score is normalised with, as text (``"none"``: a raw return)."""
_METRIC_TAG = "arl.gate."


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def promotion_decision(
    candidate: Mapping[str, Any],
    champion: Mapping[str, Any] | None,
    *,
    tolerance: float,
    cost_budget: float,
    max_forgetting: float,
) -> Decision:
    """Should ``candidate`` replace ``champion``? Every failing condition is named in the reason.

    ``candidate``/``champion`` hold ``score`` (higher is better, e.g. normalised return), ``mean_cost``
    (mean episode cost), ``forgetting`` (score lost on earlier data/env versions; absent or None when
    there are none) and ``data_validated``. The candidate must: come from validated data; have a finite
    score; keep mean cost within ``cost_budget``; forget at most ``max_forgetting``; and score at least
    ``champion.score - tolerance`` (it may trail the champion by no more than evaluation noise). Scores
    are compared only when both were computed against the same ``references``; otherwise the candidate
    is refused with the two named, since a raw return against a normalised score means nothing.
    """
    if tolerance < 0 or max_forgetting < 0:
        raise ValueError("tolerance and max_forgetting must be >= 0")
    problems: list[str] = []
    if candidate.get(VALIDATED) is not True:
        problems.append("data not validated")
    score, cost = candidate.get(SCORE), candidate.get(MEAN_COST)
    if not _finite(score):
        problems.append(f"score {score!r} is not a finite number")
    if not _finite(cost):
        problems.append(f"mean cost {cost!r} is not a finite number")
    elif cost > cost_budget:
        problems.append(f"mean cost {cost:.4g} exceeds budget {cost_budget:.4g}")
    forgetting = candidate.get(FORGETTING)
    if forgetting is not None and not _finite(forgetting):
        problems.append(f"forgetting {forgetting!r} is not a finite number")
    elif forgetting is not None and forgetting > max_forgetting:
        problems.append(f"forgetting {forgetting:.4g} exceeds bound {max_forgetting:.4g}")
    best = champion.get(SCORE) if champion is not None else None
    refs = (candidate.get(REFERENCES), champion.get(REFERENCES) if champion is not None else None)
    comparable = champion is None or not _finite(best) or refs[0] == refs[1]
    if not comparable:
        problems.append(f"score computed against references {refs[0]!r}, the champion's against {refs[1]!r}: "
                        "not comparable")
    elif champion is not None and _finite(score) and _finite(best) and score < best - tolerance:
        problems.append(f"score {score:.4g} below champion {best:.4g} minus tolerance {tolerance:.4g}")
    if problems:
        return Decision(False, "; ".join(problems))
    if champion is None or not _finite(best):
        return Decision(True, f"no comparable champion; score {score:.4g}, mean cost {cost:.4g}")
    return Decision(
        True, f"score {score:.4g} vs champion {best:.4g} (tolerance {tolerance:.4g}), mean cost {cost:.4g}"
    )


@dataclass(frozen=True)
class RegisteredPolicy:
    name: str
    version: str
    source: str


def register_policy(
    checkpoint_dir: str | Path,
    *,
    model_name: str,
    run_id: str,
    tags: Mapping[str, Any],
    tracking_uri: str | None = None,
) -> RegisteredPolicy:
    """Log the checkpoint as a pyfunc under ``policy/`` of ``run_id`` and register it as a new version.

    ``tags`` must hold every key of :data:`TRACE_TAGS`; they go onto the model version as ``arl.<key>``.
    """
    import mlflow.pyfunc

    missing = [k for k in TRACE_TAGS if tags.get(k) in (None, "")]
    if missing:
        raise ValueError(f"register_policy: missing trace tag(s) {missing}")
    c = client(tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "policy"
        mlflow.pyfunc.save_model(
            str(model_dir),
            python_model=str(Path(__file__).with_name("policy_pyfunc.py")),
            artifacts={"checkpoint": str(checkpoint_dir)},
            pip_requirements=[f"mlflow=={mlflow.__version__}", "torch==2.13.0", "numpy", "safetensors"],
        )
        c.log_artifacts(run_id, str(model_dir), artifact_path="policy")
    source = f"{c.get_run(run_id).info.artifact_uri}/policy"
    if c.search_registered_models(filter_string=f"name = '{model_name}'") == []:
        c.create_registered_model(model_name)
    mv = c.create_model_version(
        model_name, source=source, run_id=run_id, tags={f"arl.{k}": str(tags[k]) for k in tags}
    )
    return RegisteredPolicy(model_name, str(mv.version), source)


def alias_version(model_name: str, alias: str, *, tracking_uri: str | None = None) -> str | None:
    """The version behind ``alias``, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client(tracking_uri).get_model_version_by_alias(model_name, alias).version)
    except MlflowException:
        return None


def gate_metrics(model_name: str, version: str, *, tracking_uri: str | None = None) -> dict[str, Any]:
    """The gate metrics recorded on a version by :func:`promote` (empty when never gated)."""
    tags = client(tracking_uri).get_model_version(model_name, version).tags
    out: dict[str, Any] = {}
    for key in (SCORE, MEAN_COST, FORGETTING):
        if f"{_METRIC_TAG}{key}" in tags:
            out[key] = float(tags[f"{_METRIC_TAG}{key}"])
    if f"{_METRIC_TAG}{VALIDATED}" in tags:
        out[VALIDATED] = tags[f"{_METRIC_TAG}{VALIDATED}"] == "true"
    if f"{_METRIC_TAG}{REFERENCES}" in tags:
        out[REFERENCES] = tags[f"{_METRIC_TAG}{REFERENCES}"]
    return out


def promote(
    model_name: str,
    version: str,
    candidate: Mapping[str, Any],
    *,
    tolerance: float,
    cost_budget: float,
    max_forgetting: float,
    tracking_uri: str | None = None,
    rescore: Callable[[str], Mapping[str, Any]] | None = None,
) -> Decision:
    """Gate ``version`` against the current champion; set alias ``champion`` or ``challenger``; tag the reason.

    ``rescore(champion_version)``, where given, scores the champion the way the candidate was scored (its
    task version, references, episodes and seed): the gate then compares the two on that one scale when
    their recorded scores were computed against different references (another data version's, say)."""
    c = client(tracking_uri)
    current = alias_version(model_name, CHAMPION, tracking_uri=tracking_uri)
    champion = gate_metrics(model_name, current, tracking_uri=tracking_uri) if current else None
    note = ""
    if current and champion and rescore is not None and champion.get(REFERENCES) != candidate.get(REFERENCES):
        try:
            again = rescore(current)
        except (OSError, KeyError, ValueError, RuntimeError) as e:  # the champion cannot act on this version
            note = f" (the champion could not be re-scored on the candidate's scale: {e})"
        else:
            champion = {**champion, **again}
            note = f" (champion re-scored on the candidate's task version and references: {again[SCORE]:.4g})"
    decision = promotion_decision(
        candidate, champion, tolerance=tolerance, cost_budget=cost_budget, max_forgetting=max_forgetting
    )
    decision = Decision(decision.promote, decision.reason + note)
    for key in (SCORE, MEAN_COST, FORGETTING):
        if candidate.get(key) is not None:
            c.set_model_version_tag(model_name, version, f"{_METRIC_TAG}{key}", str(float(candidate[key])))
    c.set_model_version_tag(
        model_name, version, f"{_METRIC_TAG}{VALIDATED}", str(candidate.get(VALIDATED) is True).lower()
    )
    if candidate.get(REFERENCES) is not None:
        c.set_model_version_tag(model_name, version, f"{_METRIC_TAG}{REFERENCES}", str(candidate[REFERENCES]))
    alias = CHAMPION if decision.promote else CHALLENGER
    c.set_registered_model_alias(model_name, alias, version)
    c.set_model_version_tag(model_name, version, "arl.promotion", alias)
    c.set_model_version_tag(model_name, version, "arl.promotion.reason", decision.reason)
    if decision.promote and current:
        c.set_model_version_tag(model_name, current, "arl.promotion.replaced_by", version)
    return decision
