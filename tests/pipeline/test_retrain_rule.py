"""The rule a retraining run follows to choose the policy it hands the gate."""

from __future__ import annotations

from tasks.continual import choose_candidate

BOUNDS = {"max_forgetting": 10.0, "cost_budget": 10.0}


def _o(stage: str, forgetting: float, new_score: float, cost: float = 5.0) -> dict:
    return {"stage": stage, "forgetting": forgetting, "new_score": new_score, "mean_cost": cost}


def test_the_best_new_version_score_within_both_bounds_is_the_candidate() -> None:
    chosen, why = choose_candidate([_o("ewc", 4.0, 50.0), _o("finetune", 1.0, 90.0)], **BOUNDS)
    assert chosen == "finetune"
    assert why.startswith(
        "candidate finetune: the best new-version score within the forgetting bound 10 and the cost budget 10"
    )
    assert "ewc forgets 4, scores 50 at cost 5 on the new version" in why


def test_a_policy_over_the_budget_gives_way_however_well_it_scores() -> None:
    """The offline EWC policy of a retrain on safe-pendulum@1.1.0: forgets nothing, scores 72.8, pays 54.9."""
    chosen, _ = choose_candidate([_o("ewc", -3.0, 72.8, 54.9), _o("finetune", 2.0, 60.0, 8.6)], **BOUNDS)
    assert chosen == "finetune"


def test_a_policy_that_forgets_too_much_gives_way() -> None:
    chosen, _ = choose_candidate([_o("ewc", 87.0, 95.0), _o("finetune", 3.0, 60.0)], **BOUNDS)
    assert chosen == "finetune"


def test_nothing_within_the_bounds_hands_over_the_first_for_the_gate_to_refuse() -> None:
    chosen, why = choose_candidate([_o("ewc", 30.0, 70.0), _o("finetune", 1.0, 80.0, 20.0)], **BOUNDS)
    assert chosen == "ewc" and why.startswith("candidate ewc: no policy within the forgetting bound 10")


def test_boundaries_are_inclusive() -> None:
    assert choose_candidate([_o("ewc", 10.0, 50.0, 10.0), _o("finetune", 11.0, 90.0)], **BOUNDS)[0] == "ewc"
