"""The MLflow model registry and the promotion gate.

:func:`register_policy` turns a policy checkpoint directory into a registered model version (a pyfunc
built from code, so nothing is pickled), tagged with everything needed to trace it: stage, dataset hash,
env version, behaviour-policy hash, seed, git commit. :func:`promotion_decision` is the gate, a pure
function; :func:`promote` applies it in the registry under :func:`gate_lock` (one promotion per model at
a time, across processes and deployments): the version becomes ``champion`` or ``challenger``, and the
reason is recorded as a tag either way.
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arl_models.evaluate import EVAL_SEED
from tasks.tracking import client

CHAMPION, CHALLENGER = "champion", "challenger"
TRACE_TAGS = ("stage", "dataset_hash", "env_version", "policy_hash", "seed", "git_commit")
SCORE, MEAN_COST, FORGETTING, VALIDATED = "score", "mean_cost", "forgetting", "data_validated"
REFERENCES = "references"
"""The (random, expert) returns a score is normalised with, as text (``"none"``: a raw return)."""
_METRIC_TAG = "arl.gate."
GATE_LOCK_TIMEOUT_S = 600.0
"""How long a gate waits for another promotion of the same model to finish before it fails."""
GATE_LOCK_LEASE_S = 60.0
"""The lock's lease, renewed while it is held: a gate killed while holding it frees it after this long."""


@dataclass(frozen=True)
class GateSettings:
    """How the gate judges a candidate: the home of these defaults (the flow's form and the CLI read them)."""

    eval_episodes: int = 50
    """Episodes of the final evaluation, from fixed starts (the starts decide a mean cost: few are noisy)."""
    eval_seed: int = EVAL_SEED
    """Seed of the final evaluation's starts."""
    tolerance: float = 5.0
    """How far (normalised score points) a candidate may trail the champion."""
    max_forgetting: float = 10.0
    """Score a continual candidate may lose on the earlier data versions."""


GATE = GateSettings()


@dataclass(frozen=True)
class Decision:
    promote: bool
    reason: str
    previous_champion: str | None = None


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def promotion_decision(
    candidate: Mapping[str, Any],
    champion: Mapping[str, Any] | None,
    *,
    tolerance: float,
    cost_budget: float,
    max_forgetting: float,
    lineage_best: tuple[str, float] | None = None,
) -> Decision:
    """Should ``candidate`` replace ``champion``? Every failing condition is named in the reason.

    ``candidate``/``champion`` hold ``score`` (higher is better, e.g. normalised return), ``mean_cost``
    (mean episode cost), ``forgetting`` (score lost on earlier data/env versions; absent or None when
    there are none) and ``data_validated``. The candidate must: come from validated data; have a finite
    score; keep mean cost within ``cost_budget``; forget at most ``max_forgetting``; and score at least
    ``champion.score - tolerance`` (it may trail the champion by no more than evaluation noise) and
    at least ``lineage_best - tolerance``, the best score of any earlier champion against the same
    references (``(version, score)``), so that promotions within tolerance cannot ratchet the champion
    down step by step. A champion without a finite score stops promotion: nothing is compared with it.
    Scores are compared only when both were computed against the same ``references``; otherwise the
    candidate is refused with the two named, since a raw return against a normalised score means nothing.
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
    problems += _against_champions(candidate, champion, lineage_best, tolerance)
    if problems:
        return Decision(False, "; ".join(problems))
    if champion is None:
        return Decision(True, f"no champion yet; score {score:.4g}, mean cost {cost:.4g}")
    best = champion[SCORE]
    bar = f" and the lineage's best {lineage_best[1]:.4g} (v{lineage_best[0]})" if lineage_best else ""
    return Decision(
        True,
        f"score {score:.4g} vs champion {best:.4g}{bar} (tolerance {tolerance:.4g}), mean cost {cost:.4g}",
    )


def _against_champions(
    candidate: Mapping[str, Any],
    champion: Mapping[str, Any] | None,
    lineage_best: tuple[str, float] | None,
    tolerance: float,
) -> list[str]:
    """What stops ``candidate`` when it is compared with the champion and the lineage's best."""
    if champion is None:
        return []
    score, best = candidate.get(SCORE), champion.get(SCORE)
    if not _finite(best):
        return [f"the champion's score {best!r} is not a finite number: promotion stops until it is scored"]
    refs = (candidate.get(REFERENCES), champion.get(REFERENCES))
    if refs[0] != refs[1]:
        return [
            f"score computed against references {refs[0]!r}, the champion's against {refs[1]!r}: "
            "not comparable"
        ]
    if not _finite(score):
        return []
    if score < best - tolerance:
        return [f"score {score:.4g} below champion {best:.4g} minus tolerance {tolerance:.4g}"]
    if lineage_best is not None and score < lineage_best[1] - tolerance:
        return [
            f"score {score:.4g} below the lineage's best champion {lineage_best[1]:.4g} "
            f"(v{lineage_best[0]}) minus tolerance {tolerance:.4g}"
        ]
    return []


class _DropMessage(logging.Filter):
    """Drops the records of one logger whose message starts with ``prefix``: a line that is noise here."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


_EXAMPLE_CHECKED = _DropMessage("Validating input example against model signature")
"""MLflow's INFO line on every saved model with an input example: the check passing is no news."""


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
    The model carries what serving it needs: ``arl_models`` as code (MLflow's ``code_paths``), the pinned
    :func:`serving_requirements`, the :func:`policy_signature` MLflow enforces on every request and an
    example request of one observation.
    """
    import mlflow.pyfunc

    import arl_models

    missing = [k for k in TRACE_TAGS if tags.get(k) in (None, "")]
    if missing:
        raise ValueError(f"register_policy: missing trace tag(s) {missing}")
    c = client(tracking_uri)  # also turns MLflow's progress bar off: saving copies the artifacts through it
    signature = policy_signature(checkpoint_dir)
    logging.getLogger("mlflow.pyfunc").addFilter(_EXAMPLE_CHECKED)  # once: a filter is added only once
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "policy"
        mlflow.pyfunc.save_model(
            str(model_dir),
            python_model=str(Path(__file__).with_name("policy_pyfunc.py")),
            artifacts={"checkpoint": str(checkpoint_dir)},
            code_paths=[str(Path(arl_models.__file__).parent)],
            pip_requirements=serving_requirements(),
            signature=signature,
            input_example=None if signature is None else _observation_example(signature),
        )
        c.log_artifacts(run_id, str(model_dir), artifact_path="policy")
    source = f"{c.get_run(run_id).info.artifact_uri}/policy"
    if c.search_registered_models(filter_string=f"name = '{model_name}'") == []:
        c.create_registered_model(model_name)
    mv = c.create_model_version(
        model_name, source=source, run_id=run_id, tags={f"arl.{k}": str(tags[k]) for k in tags}
    )
    return RegisteredPolicy(model_name, str(mv.version), source)


SERVING_DISTRIBUTIONS = ("mlflow", "numpy", "torch", "safetensors", "pyarrow")
"""What a registered policy imports to load and predict: ``tasks/policy_pyfunc.py`` (mlflow, numpy) and the
``arl_models`` modules behind ``load_policy`` (torch, safetensors, numpy, pyarrow)."""


def serving_requirements() -> list[str]:
    """The pip requirements of a registered policy: each of :data:`SERVING_DISTRIBUTIONS` pinned to the
    version installed here, without a local label such as ``+cpu`` (no public index carries those)."""
    from importlib.metadata import version

    return [f"{name}=={version(name).split('+')[0]}" for name in SERVING_DISTRIBUTIONS]


def policy_signature(checkpoint_dir: str | Path) -> Any:
    """The ``ModelSignature`` MLflow enforces when a registered policy predicts: float32 observations
    ``(N, obs_dim)`` in (one unnamed tensor, so a request's ``inputs`` is a list of rows), float32 actions
    ``(N, action_dim)`` out, the widths read from ``env`` in the handed-over policy's ``config.json``, and
    a boolean parameter ``deterministic`` (default true). None for a directory without a ``config.json``
    (no record to read the widths from)."""
    import json

    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types import ParamSchema, ParamSpec, Schema, TensorSpec

    from arl_models.checkpoint import handed_over

    record = handed_over(checkpoint_dir) / "config.json"
    if not record.is_file():
        return None
    env = json.loads(record.read_text())["env"]
    return ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.float32), (-1, int(env["obs_dim"])))]),
        outputs=Schema([TensorSpec(np.dtype(np.float32), (-1, int(env["action_dim"])))]),
        params=ParamSchema([ParamSpec("deterministic", "boolean", True)]),
    )


def _observation_example(signature: Any) -> Any:
    """One observation of zeros of the signature's width: the request example MLflow stores beside the
    model (``serving_input_example.json``) and checks against the signature when it saves it."""
    import numpy as np

    (obs,) = signature.inputs.inputs
    return np.zeros((1, int(obs.shape[-1])), dtype=np.float32)


def describe_signature(model_uri: str, *, tracking_uri: str | None = None) -> str | None:
    """What the model at ``model_uri`` takes and returns, from its signature, as one line
    (``observations float32 [-1, 3] -> actions float32 [-1, 1]``); None for a model without one.
    A model that cannot be read is a ``ValueError`` naming the URI."""
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException
    from mlflow.models import Model

    from tasks.tracking import quiet_artifact_progress

    quiet_artifact_progress()
    try:
        mlmodel = download_artifacts(
            f"{model_uri.rstrip('/')}/MLmodel", tracking_uri=tracking_uri, registry_uri=tracking_uri
        )
    except (MlflowException, OSError) as e:
        raise ValueError(f"cannot read the model {model_uri}: {e}") from e
    signature = Model.load(mlmodel).signature
    if signature is None or signature.inputs is None or signature.outputs is None:
        return None
    (obs,), (act,) = signature.inputs.inputs, signature.outputs.inputs
    return f"observations {obs.type} {list(obs.shape)} -> actions {act.type} {list(act.shape)}"


def alias_version(model_name: str, alias: str, *, tracking_uri: str | None = None) -> str | None:
    """The version behind ``alias``, or None."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client(tracking_uri).get_model_version_by_alias(model_name, alias).version)
    except MlflowException:
        return None


def gate_metrics(model_name: str, version: str, *, tracking_uri: str | None = None) -> dict[str, Any]:
    """The gate metrics recorded on a version by :func:`promote` (empty when never gated)."""
    return _gate_metrics(client(tracking_uri).get_model_version(model_name, version).tags)


def _gate_metrics(tags: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in (SCORE, MEAN_COST, FORGETTING):
        if f"{_METRIC_TAG}{key}" in tags:
            out[key] = float(tags[f"{_METRIC_TAG}{key}"])
    if f"{_METRIC_TAG}{VALIDATED}" in tags:
        out[VALIDATED] = tags[f"{_METRIC_TAG}{VALIDATED}"] == "true"
    if f"{_METRIC_TAG}{REFERENCES}" in tags:
        out[REFERENCES] = tags[f"{_METRIC_TAG}{REFERENCES}"]
    return out


@contextmanager
def gate_lock(model_name: str, timeout_s: float = GATE_LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the gate of ``model_name``: a Prefect global concurrency limit of one slot, ``arl-gate-<model>``,
    shared by every process and deployment that talks to the same Prefect API. Raises TimeoutError
    when another gate holds it longer than ``timeout_s``."""
    from prefect import get_client
    from prefect.concurrency.sync import concurrency

    name = f"arl-gate-{model_name}"
    with get_client(sync_client=True) as prefect:
        prefect.upsert_global_concurrency_limit_by_name(name, 1)
    with concurrency(
        name, occupy=1, timeout_seconds=timeout_s, lease_duration=GATE_LOCK_LEASE_S, strict=True
    ):
        yield


def lineage_best(
    model_name: str, references: Any, *, tracking_uri: str | None = None
) -> tuple[str, float] | None:
    """``(version, score)`` of the best-scoring version ever made champion of ``model_name`` whose score was
    computed against ``references``; None when there is none."""
    best: tuple[str, float] | None = None
    for mv in client(tracking_uri).search_model_versions(f"name = '{model_name}'"):
        if mv.tags.get("arl.promotion") != CHAMPION:
            continue
        m = _gate_metrics(mv.tags)
        if m.get(REFERENCES) == references and _finite(m.get(SCORE)) and (best is None or m[SCORE] > best[1]):
            best = (str(mv.version), float(m[SCORE]))
    return best


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
    note: str = "",
) -> Decision:
    """Gate ``version`` against the current champion and the lineage's best; set alias ``champion`` or
    ``challenger``; tag the reason. Reading the champion, deciding and moving the alias happen under
    :func:`gate_lock`, so two gates at once cannot both replace the champion they read.

    ``rescore(champion_version)``, where given, scores the champion the way the candidate was scored (its
    task version, references, episodes and seed): the gate then compares the two on that one scale when
    the champion's recorded score was computed against other references (another data version's, say)
    or is missing. ``note`` (how the candidate was chosen) goes before the reason."""
    with gate_lock(model_name):
        current = alias_version(model_name, CHAMPION, tracking_uri=tracking_uri)
        if current == version:
            return Decision(True, f"version {version} is already the champion", current)
        champion, rescored = _champion(model_name, current, candidate, rescore, tracking_uri)
        decision = promotion_decision(
            candidate,
            champion,
            tolerance=tolerance,
            cost_budget=cost_budget,
            max_forgetting=max_forgetting,
            lineage_best=lineage_best(model_name, candidate.get(REFERENCES), tracking_uri=tracking_uri),
        )
        reason = decision.reason + rescored
        decision = Decision(decision.promote, f"{note}: {reason}" if note else reason, current)
        _record(model_name, version, candidate, decision, tracking_uri)
        return decision


def _champion(
    model_name: str,
    current: str | None,
    candidate: Mapping[str, Any],
    rescore: Callable[[str], Mapping[str, Any]] | None,
    tracking_uri: str | None,
) -> tuple[dict[str, Any] | None, str]:
    """The champion's gate metrics, re-scored on the candidate's scale where needed, and a note saying so."""
    if current is None:
        return None, ""
    champion = gate_metrics(model_name, current, tracking_uri=tracking_uri)
    unscored = not _finite(champion.get(SCORE))
    if rescore is None or (champion.get(REFERENCES) == candidate.get(REFERENCES) and not unscored):
        return champion, ""
    try:
        again = rescore(current)
    except (OSError, KeyError, ValueError, RuntimeError) as e:  # the champion cannot act on this version
        return champion, f" (the champion could not be re-scored on the candidate's scale: {e})"
    note = f" (champion re-scored on the candidate's task version and references: {again[SCORE]:.4g})"
    return {**champion, **again}, note


def _record(
    model_name: str, version: str, candidate: Mapping[str, Any], decision: Decision, tracking_uri: str | None
) -> None:
    """Tag ``version`` with its gate metrics and the decision, and move the alias it earned."""
    c = client(tracking_uri)
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
    if decision.promote and decision.previous_champion:
        c.set_model_version_tag(model_name, decision.previous_champion, "arl.promotion.replaced_by", version)
