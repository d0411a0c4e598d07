"""Honest learning tests on safe-pendulum: real data from the project's own SAC, baselines measured
in the same test. Slow (minutes): `make test` runs them, `make test-fast` does not."""

import json

import pytest

from arl_models.data import read_info
from arl_models.offline import evaluate_checkpoint, train_bc, train_cql

pytestmark = pytest.mark.slow
EPISODES = 20


def test_behaviour_run_makes_the_constraint_bind(pendulum_datasets):
    """The SAC expert, trained without the constraint, exceeds the task's cost budget."""
    info = read_info(pendulum_datasets["expert"])
    assert (
        info.extra["cost_fn"] == "ActuatorEffortCost(threshold=1.0, ramp=1.0)"
    )  # what labelled the cost column
    behaviour = json.loads((pendulum_datasets["expert"].parent / "behaviour" / "behaviour.json").read_text())
    assert behaviour["expert_return"] > behaviour["medium_return"] > info.ref_random_return
    from arl_models.data import read_dataset

    t, _ = read_dataset(pendulum_datasets["expert"])
    assert t.episode_costs().mean() > info.cost_budget


def test_bc_on_expert_data_reaches_most_of_the_expert_return(pendulum_datasets, tmp_path):
    train_bc(pendulum_datasets["expert"], tmp_path / "bc", progress=False, eval_episodes=0)
    res = evaluate_checkpoint(tmp_path / "bc", episodes=EPISODES)
    assert res.normalized_score is not None and res.normalized_score >= 80.0, res


def test_cql_beats_bc_on_medium_replay(pendulum_datasets, tmp_path):
    data = pendulum_datasets["medium-replay"]
    train_bc(data, tmp_path / "bc", progress=False, eval_episodes=0)
    train_cql(data, tmp_path / "cql", progress=False, eval_episodes=0, constrained=False)
    bc = evaluate_checkpoint(tmp_path / "bc", episodes=EPISODES)
    cql = evaluate_checkpoint(tmp_path / "cql", episodes=EPISODES)
    assert cql.normalized_score > bc.normalized_score + 15.0, (bc.normalized_score, cql.normalized_score)


@pytest.mark.parametrize("algo,steps", [("td3bc", 10_000), ("iql", 15_000)])
def test_the_offline_half_beats_bc_on_random_and_expert_data(pendulum_datasets, tmp_path, algo, steps):
    """Half the episodes random, half expert: BC copies both, stage 2 should prefer the expert's actions.
    BC at the demo preset's steps, then ``algo`` from it (``arl train offline``), unconstrained."""
    from arl_models.data.dataset import merge_datasets
    from arl_models.offline import train_offline

    data = tmp_path / "random-expert"
    merge_datasets([pendulum_datasets["random"], pendulum_datasets["expert"]], data)
    train_offline(data, tmp_path, algo=algo, steps=steps, progress=False, eval_episodes=0, constrained=False)
    bc = evaluate_checkpoint(tmp_path / "bc", episodes=EPISODES)
    stage2 = evaluate_checkpoint(tmp_path / algo, episodes=EPISODES)
    assert stage2.normalized_score > bc.normalized_score + 15.0, (
        bc.normalized_score,
        stage2.normalized_score,
    )
