"""``OUT/best``: the best policy a fine-tuning run went through, within the budget."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from arl_models.checkpoint import BEST, handed_over, load_policy, read_config
from arl_models.envs.registry import get_task
from arl_models.evaluate import EVAL_SEED, evaluate
from arl_models.online import FinetuneConfig, OnlineState, Session, best_selection, build_algo, finetune

TINY = FinetuneConfig(
    steps=800, num_envs=2, vector="sync", utd=0.05, eval_episodes=2, eval_every=1, batch_size=32
)


def _session(tiny_cql, out, cfg=TINY, budget=10.0) -> Session:
    algo = build_algo(read_config(tiny_cql), cfg)
    return Session(
        algo,
        cfg,
        get_task("safe-pendulum"),
        budget,
        None,
        None,
        OnlineState(),
        read_config(tiny_cql),
        out,
        None,
        None,
        None,
        None,
        False,
    )


def test_only_an_improvement_within_the_budget_replaces_the_best(tiny_cql, tmp_path):
    s = _session(tiny_cql, tmp_path)
    s.keep_best({"eval/return": -500.0, "eval/cost": 3.0})
    assert best_selection(tmp_path) == {"step": 0, "return": -500.0, "cost": 3.0, "episodes": 2}
    s.state.env_steps = 100
    s.keep_best({"eval/return": -400.0, "eval/cost": 12.0})  # better, but over the budget of 10
    s.keep_best({"eval/return": -510.0, "eval/cost": 0.0})  # within, but worse
    assert best_selection(tmp_path)["step"] == 0
    s.keep_best({"eval/return": -450.0, "eval/cost": 10.0})  # at the budget counts as within
    assert best_selection(tmp_path) == {"step": 100, "return": -450.0, "cost": 10.0, "episodes": 2}
    assert load_policy(tmp_path / BEST).act([0.0, 1.0, 0.0]).shape == (1,)
    assert not list(tmp_path.glob(".best.*")), "the swap leaves no temporary directory"


def test_a_budget_that_is_not_positive_is_refused(tiny_cql, pendulum_data, tmp_path):
    with pytest.raises(ValueError, match="budget must be positive"):
        finetune(
            tiny_cql,
            tmp_path / "ft",
            data=pendulum_data,
            config=replace(TINY, cost_budget=0.0),
            progress=False,
        )


def test_no_best_is_kept_when_switched_off_or_when_nothing_was_evaluated(tiny_cql, tmp_path):
    _session(tiny_cql, tmp_path / "off", replace(TINY, keep_best=False)).keep_best(
        {"eval/return": 1.0, "eval/cost": 0.0}
    )
    _session(tiny_cql, tmp_path / "none").keep_best({"online/episode_return": 1.0})
    assert best_selection(tmp_path / "off") is None and best_selection(tmp_path / "none") is None


@pytest.mark.parametrize("budget", [1e9, 1e-9], ids=["every-evaluation-eligible", "none-eligible"])
def test_a_run_keeps_the_best_of_its_evaluations_and_that_policy_scores_it_again(
    tiny_cql, pendulum_data, tmp_path, budget
):
    out = tmp_path / "ft"
    cfg = replace(
        TINY, cost_budget=budget, constrained=budget > 1
    )  # the multiplier would only wind up at 1e-9
    final = finetune(tiny_cql, out, data=pendulum_data, config=cfg, progress=False)
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [read_config(out)["initial_eval"], *(r for r in rows if "eval/return" in r)]
    eligible = [e for e in evals if e["eval/cost"] <= budget]
    assert len(evals) >= 3 and (len(eligible) == len(evals) if budget > 1 else not eligible)
    if not eligible:  # the pendulum's effort cost is positive on every evaluation
        assert best_selection(out) is None and "best/return" not in final
        assert handed_over(out) == out, "without best/ the stage hands over its own weights"
        return
    best = best_selection(out)
    assert handed_over(out) == out / BEST
    assert best["return"] == max(e["eval/return"] for e in eligible) == final["best/return"]
    again = evaluate(load_policy(out / BEST).act, get_task("safe-pendulum"), 2, seed=EVAL_SEED)
    assert again.mean_return == pytest.approx(best["return"], rel=1e-5), (
        "best/ holds the weights it was selected on"
    )
