"""The promotion gate is a pure function: every combination of conditions, and every boundary."""

from __future__ import annotations

import itertools
import math

import pytest

from tasks.registry import promotion_decision

GATE = {"tolerance": 1.0, "cost_budget": 5.0, "max_forgetting": 2.0}
CHAMPIONS = {"none": None, "worse": {"score": 50.0}, "near": {"score": 60.5}, "better": {"score": 70.0}}
SCORES = {"ok": 60.0, "nan": math.nan, "missing": None}
COSTS = {"ok": 4.0, "over": 6.0, "inf": math.inf}
FORGETTING = {"none": None, "ok": 1.5, "over": 3.0}


@pytest.mark.parametrize(
    "validated,score,cost,forgetting,champion",
    list(itertools.product([True, False], SCORES, COSTS, FORGETTING, CHAMPIONS)),
)
def test_every_combination(validated: bool, score: str, cost: str, forgetting: str, champion: str) -> None:
    candidate = {"data_validated": validated, "mean_cost": COSTS[cost], "forgetting": FORGETTING[forgetting]}
    if SCORES[score] is not None:
        candidate["score"] = SCORES[score]
    d = promotion_decision(candidate, CHAMPIONS[champion], **GATE)
    failed = {
        "data not validated": not validated,
        f"score {SCORES[score]!r} is not": score != "ok",
        "exceeds budget": cost == "over",
        "mean cost inf is not": cost == "inf",
        "exceeds bound": forgetting == "over",
        "below champion": champion == "better" and score == "ok",
    }
    assert d.promote == (not any(failed.values())), d.reason
    if not d.promote:
        assert {p for p in failed if p in d.reason} == {p for p, bad in failed.items() if bad}, d.reason


def test_boundaries_are_inclusive() -> None:
    at_edge = {"data_validated": True, "score": 59.0, "mean_cost": 5.0, "forgetting": 2.0}
    assert promotion_decision(at_edge, {"score": 60.0}, **GATE).promote
    just_below = {**at_edge, "score": 58.999}
    assert not promotion_decision(just_below, {"score": 60.0}, **GATE).promote


def test_first_policy_is_promoted_and_reason_says_why() -> None:
    d = promotion_decision({"data_validated": True, "score": 10.0, "mean_cost": 0.0}, None, **GATE)
    assert d.promote and "no champion yet" in d.reason


@pytest.mark.parametrize("champion", [{}, {"score": math.nan}, {"score": math.inf}])
def test_a_champion_without_a_finite_score_stops_promotion(champion: dict) -> None:
    d = promotion_decision({"data_validated": True, "score": 10.0, "mean_cost": 0.0}, champion, **GATE)
    assert not d.promote and "champion's score" in d.reason and "not a finite number" in d.reason


def test_the_lineage_best_bounds_the_slide() -> None:
    """Six promotions within tolerance of the one before would slide 90 to 84; the lineage's best stops it."""
    ok = {"data_validated": True, "mean_cost": 0.0}
    assert promotion_decision(
        {**ok, "score": 89.0}, {"score": 90.0}, **GATE, lineage_best=("1", 90.0)
    ).promote
    d = promotion_decision({**ok, "score": 88.5}, {"score": 89.0}, **GATE, lineage_best=("1", 90.0))
    assert not d.promote and "lineage's best champion 90 (v1)" in d.reason


def test_all_reasons_are_listed() -> None:
    bad = {"data_validated": False, "score": 1.0, "mean_cost": 9.0, "forgetting": 9.0}
    d = promotion_decision(bad, {"score": 80.0}, **GATE)
    assert not d.promote
    assert d.reason.count(";") == 3
    assert "9 exceeds budget 5" in d.reason and "below champion 80" in d.reason


@pytest.mark.parametrize("value", [True, "1.0", [1.0]])
def test_non_numbers_are_rejected(value: object) -> None:
    d = promotion_decision({"data_validated": True, "score": value, "mean_cost": 0.0}, None, **GATE)
    assert not d.promote and "score" in d.reason


def test_truthy_validation_flag_is_not_enough() -> None:
    d = promotion_decision({"data_validated": "yes", "score": 1.0, "mean_cost": 0.0}, None, **GATE)
    assert not d.promote and "data not validated" in d.reason


@pytest.mark.parametrize("bad", [{"tolerance": -1.0}, {"max_forgetting": -0.1}])
def test_negative_bounds_are_an_error(bad: dict) -> None:
    with pytest.raises(ValueError):
        promotion_decision({"score": 1.0}, None, **{**GATE, **bad})


def test_scores_against_different_references_are_not_compared() -> None:
    candidate = {"data_validated": True, "score": 541.5, "mean_cost": 0.0, "references": "none"}
    champion = {"score": 94.4, "references": "random -20.27, expert 3234.3"}
    d = promotion_decision(candidate, champion, **GATE)
    assert not d.promote and "not comparable" in d.reason and "'none'" in d.reason
    same = {**candidate, "score": 94.0, "references": champion["references"]}
    assert promotion_decision(same, champion, **GATE).promote
