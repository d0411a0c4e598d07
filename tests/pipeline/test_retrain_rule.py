"""The rule a retraining run follows to choose the policy it hands the gate."""

from __future__ import annotations

from tasks.continual import choose_candidate


def _o(stage: str, forgetting: float, new_score: float) -> dict:
    return {"stage": stage, "forgetting": forgetting, "new_score": new_score}


def test_ewc_within_the_bound_is_the_candidate_even_when_another_scores_more() -> None:
    chosen, why = choose_candidate([_o("ewc", 4.0, 50.0), _o("finetune", 1.0, 90.0)], 10.0)
    assert chosen == "ewc" and why == "candidate ewc: it forgets 4, within the bound 10"


def test_ewc_over_the_bound_gives_way_to_the_best_new_score_within_it() -> None:
    chosen, why = choose_candidate([_o("ewc", 87.0, 7.1), _o("finetune", 3.0, 60.0)], 10.0)
    assert chosen == "finetune"
    assert why.startswith("candidate finetune: the best new-version score within the forgetting bound 10")
    assert "ewc forgets 87, scores 7.1 on the new version" in why


def test_nothing_within_the_bound_hands_over_ewc_for_the_gate_to_refuse() -> None:
    chosen, why = choose_candidate([_o("ewc", 30.0, 70.0), _o("finetune", 20.0, 80.0)], 10.0)
    assert chosen == "ewc" and why.startswith("candidate ewc: no policy forgets within the bound 10")


def test_without_ewc_the_measured_stage_is_judged_either_way() -> None:
    assert choose_candidate([_o("finetune", 2.0, 60.0)], 10.0)[0] == "finetune"
    assert choose_candidate([_o("finetune", 20.0, 60.0)], 10.0)[0] == "finetune"
