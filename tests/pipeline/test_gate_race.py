"""The gate in the registry: two gates at once, and a champion that cannot slide down step by step."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tasks import registry, tracking

pytestmark = pytest.mark.e2e
GATE = {"tolerance": 5.0, "cost_budget": 5.0, "max_forgetting": 2.0}


def _versions(name: str, n: int, mlflow_uri: str, tmp_path: Path) -> list[str]:
    """``n`` versions of a new registered model (the gate reads only their tags and aliases)."""
    c = tracking.client(mlflow_uri)
    c.create_registered_model(name)
    return [str(c.create_model_version(name, source=(tmp_path / f"v{i}").as_uri()).version) for i in range(n)]


def _candidate(score: float) -> dict:
    return {"score": score, "mean_cost": 1.0, "data_validated": True}


def test_two_gates_racing_leave_the_better_champion(
    mlflow_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worse candidate's gate reads "no champion", then stalls before it moves the alias; the better one
    starts meanwhile. Without the lock both see no champion and the stalled, worse one lands last."""
    name = "arl-race"
    worse, better = _versions(name, 2, mlflow_uri, tmp_path)
    stalled = threading.Event()
    decide = registry.promotion_decision

    def slow_for_the_worse(candidate, champion, **kw):
        d = decide(candidate, champion, **kw)
        if candidate["score"] == 50.0:
            stalled.set()
            time.sleep(3.0)
        return d

    monkeypatch.setattr(registry, "promotion_decision", slow_for_the_worse)
    results: dict[str, registry.Decision] = {}

    def gate(version: str, score: float) -> None:
        results[version] = registry.promote(name, version, _candidate(score), **GATE, tracking_uri=mlflow_uri)

    with registry.gate_lock(name):  # the Prefect server holding the lock is up before the race starts
        pass
    slow = threading.Thread(target=gate, args=(worse, 50.0))
    slow.start()
    assert stalled.wait(60)
    gate(better, 90.0)
    slow.join(60)
    assert registry.alias_version(name, registry.CHAMPION, tracking_uri=mlflow_uri) == better
    assert results[worse].promote and results[worse].previous_champion is None
    assert results[better].promote and results[better].previous_champion == worse
    assert "vs champion 50" in results[better].reason


def test_the_champion_cannot_slide_down_within_tolerance(mlflow_uri: str, tmp_path: Path) -> None:
    """90, then 86 (within 5 of 90), then 82 (within 5 of 86, not of the lineage's best 90): refused."""
    name = "arl-ratchet"
    v = _versions(name, 3, mlflow_uri, tmp_path)
    assert registry.promote(name, v[0], _candidate(90.0), **GATE, tracking_uri=mlflow_uri).promote
    assert registry.promote(name, v[1], _candidate(86.0), **GATE, tracking_uri=mlflow_uri).promote
    d = registry.promote(name, v[2], _candidate(82.0), **GATE, tracking_uri=mlflow_uri)
    assert not d.promote and f"lineage's best champion 90 (v{v[0]})" in d.reason
    assert registry.lineage_best(name, None, tracking_uri=mlflow_uri) == (v[0], 90.0)
    assert registry.alias_version(name, registry.CHAMPION, tracking_uri=mlflow_uri) == v[1]


def test_a_champion_without_a_score_stops_promotion(mlflow_uri: str, tmp_path: Path) -> None:
    """A champion set by hand (no gate metrics) is not waved past; a rescorer that can score it unblocks."""
    name = "arl-unscored"
    v = _versions(name, 3, mlflow_uri, tmp_path)
    tracking.client(mlflow_uri).set_registered_model_alias(name, registry.CHAMPION, v[0])
    d = registry.promote(name, v[1], _candidate(70.0), **GATE, tracking_uri=mlflow_uri)
    assert not d.promote and "champion's score None is not a finite number" in d.reason
    assert registry.alias_version(name, registry.CHAMPION, tracking_uri=mlflow_uri) == v[0]
    d = registry.promote(
        name, v[2], _candidate(70.0), **GATE, tracking_uri=mlflow_uri, rescore=lambda version: {"score": 60.0}
    )
    assert d.promote and "re-scored" in d.reason
